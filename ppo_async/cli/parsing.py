"""tyro parsing whose rejections are one-line `ConfigError`s (exit status 2 at the entry point).

tyro reports a rejected command line in a box of several lines on stderr and exits with
status 2. The CLI's contract is one line, `error: ...`, naming the option and the value. tyro
(>= 1.0) announces each rejection to a hook before printing it (`tyro._errors`: private and
unstable, so every use is guarded); the hook raises `ConfigError` with the line instead. A
rejection the hook does not know, or a tyro without the hook, still ends as one line: the box
tyro printed, flattened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import re
import sys
import typing
from typing import Any, Callable, Collection, Iterator, Sequence

import tyro

from ppo_async.config.checks import FieldFailures, field_of
from ppo_async.errors import ConfigError

try:  # tyro >= 1.0; older versions print their box, flattened below
    from tyro import _errors as tyro_errors
except ImportError:  # pragma: no cover - depends on the installed tyro
    tyro_errors = None

PROG = "python -m ppo_async"


def parse(target: Any, args: Sequence[str], prog: str = PROG, *, command: str = "", default: Any = tyro.MISSING_NONPROP,
          description: str | None = None, unknown: Callable[[list[str]], str] | None = None,
          return_unknown_args: bool = False, add_help: bool = True, own: Any = None) -> Any:
    """`tyro.cli(target, args=args, ...)`; a rejected command line raises ConfigError with one
    line, prefixed `COMMAND: ` when `command` is given (`unknown(tokens)` for unrecognised
    arguments, when given; an unknown option's hint is about the flags and positional
    arguments of `own`, the command's dataclass, default `target`). `--help` prints the help
    and raises SystemExit(0), as tyro does."""
    captured = io.StringIO()
    own = target if own is None else own
    hook = _Hook(list(args), command, unknown, dataclass_flags(own), positional_fields(own))
    try:
        with contextlib.redirect_stderr(captured), _on_parse_error(hook):
            parsed = tyro.cli(target, args=list(args), prog=prog, default=default, description=description,
                              return_unknown_args=return_unknown_args, add_help=add_help)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise ConfigError(hook.prefix + (flatten(captured.getvalue()) or f"invalid arguments {list(args)}")) from None
        sys.stderr.write(captured.getvalue())
        raise
    sys.stderr.write(captured.getvalue())  # what else was printed meanwhile (warnings)
    return parsed


@contextlib.contextmanager
def _on_parse_error(hook: Callable[[Any], None]) -> Iterator[None]:
    if tyro_errors is None or not hasattr(tyro_errors, "on_parse_error"):  # pragma: no cover
        yield
        return
    with tyro_errors.on_parse_error(hook):
        yield


def flag_of(path: str) -> str:
    """The command-line flag of a dotted field: `"ppo.clip_eps"` -> `"--ppo.clip-eps"`."""
    return "--" + path.replace("_", "-")


def _hints(cls: type) -> dict[str, Any]:
    """The annotations of a dataclass with their `Annotated` markers (empty when one names what
    its module imports only for type checkers)."""
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except NameError:
        return {}


def _markers(hint: Any) -> tuple[Any, ...]:
    """The tyro markers of an annotation: `Annotated[T, m1, m2]` -> (m1, m2); nested `Annotated` too."""
    markers: tuple[Any, ...] = ()
    while typing.get_origin(hint) is typing.Annotated:
        markers += tuple(typing.get_args(hint)[1:])
        hint = typing.get_args(hint)[0]
    return markers


def _unwrapped(hint: Any) -> Any:
    """The type inside any `Annotated[...]` layers."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _is_flagless(markers: Sequence[Any]) -> bool:
    """Whether tyro gives a field with these markers no `--flag`: positional or suppressed."""
    return any(m is tyro.conf.Positional or m is tyro.conf.Suppress for m in markers)


def positional_fields(target: Any) -> dict[str, str]:
    """The fields tyro reads positionally in the dataclasses of `target`, each with the name
    its help shows (the metavar): `compare`'s `{"run_dirs": "RUN_DIR"}` (`compare A B`, never
    `--run-dirs A B`)."""
    if dataclasses.is_dataclass(target):
        out = {}
        for f in dataclasses.fields(target):
            markers = _markers(_hints(target).get(f.name, f.type))
            if tyro.conf.Positional in markers:
                metavars = [m.metavar for m in markers if getattr(m, "metavar", None)]
                out[f.name] = metavars[0] if metavars else f.name.upper()
        return out
    return {name: metavar for arg in typing.get_args(target) for name, metavar in positional_fields(arg).items()}


def dataclass_flags(target: Any, prefix: str = "") -> list[str]:
    """Every flag of the dataclasses in `target` (a dataclass, or a Union / Annotated of them,
    as tyro reads it): nested sections as `--section.field`, a section named "" flattened;
    positional and suppressed fields have none."""
    if dataclasses.is_dataclass(target):
        flags = []
        hints = _hints(target)
        for f in dataclasses.fields(target):
            hint = hints.get(f.name, f.type)
            markers, inner = _markers(hint), _unwrapped(hint)
            name = "" if any(getattr(m, "name", None) == "" for m in markers) else f.name
            if dataclasses.is_dataclass(inner):
                flags += dataclass_flags(inner, f"{prefix}{name}." if name else prefix)
            elif not _is_flagless(markers):
                flags.append(flag_of(prefix + f.name))
        return flags
    return [flag for arg in typing.get_args(target) for flag in dataclass_flags(arg, prefix)]


def did_you_mean_flag(token: str, flags: Sequence[str]) -> str:
    """`"; did you mean --ppo.gamma?"` for the flags nearest to `token` (difflib), else `""`;
    never `token` itself (it was refused)."""
    option = token.partition("=")[0]
    known = [flag for flag in dict.fromkeys(flags) if flag != option]
    close = difflib.get_close_matches(option, known, n=3, cutoff=0.6)
    return "; did you mean " + " or ".join(close) + "?" if close else ""


_ASSIGNMENT = re.compile(r"^(?:[a-z]+: )?([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*) = ")


class Explained(ConfigError):
    """A ConfigError already in the command line's words (`in_their_words`): printed as it is."""


def as_command_line(message: str, fields: Sequence[str]) -> str:
    """A ConfigError's message in the command line's words: a leading `COMMAND: ` dropped and a
    leading `field = ` naming one of `fields` (dotted) written as its flag:
    `"train: ppo.clip_eps = 2.0 is invalid: ..."` -> `"--ppo.clip-eps = 2.0 is invalid: ..."`."""
    message = re.sub(r"^[a-z]+: (?=--[\w.-]+ = )", "", message)
    match = _ASSIGNMENT.match(message)
    if match is None or match.group(1) not in fields:
        return message
    return flag_of(match.group(1)) + message[match.end(1):]


def in_their_words(exc: ConfigError, fields: Sequence[str], file: str | None = None,
                   file_fields: Collection[str] = (), flags: Collection[str] = ()) -> str:
    """The one line of a rejected command: each failure (several for a `FieldFailures`, "; "
    between them) names its field where the user set it: `FILE: field = ...` for a field the
    config file `file` sets (`file_fields`, dotted; "" among them: a failure naming no field
    comes from the file too) and no flag overrides (`flags`), else the flag (`as_command_line`),
    so an error never names a flag for a value the user wrote in a file. When every failure is
    the file's, the file is named once, first."""
    if isinstance(exc, Explained):
        return str(exc)
    failures = exc.failures if isinstance(exc, FieldFailures) else [(field_of(str(exc)), str(exc))]
    in_file = [file is not None and field in file_fields and field not in flags for field, _ in failures]
    parts = [re.sub(r"^[a-z]+: ", "", message) if mine else as_command_line(message, fields)
             for (_, message), mine in zip(failures, in_file)]
    if all(in_file):
        return f"{file}: " + "; ".join(parts)
    return "; ".join(f"{file}: {part}" if mine else part for part, mine in zip(parts, in_file))


def flatten(box: str) -> str:
    """tyro's error box as one line: no box drawing, no help footer, whitespace collapsed."""
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", box).split())
    return re.sub(r"\s*For full helptext, (run|see) .*$", "", text).strip()


class _Hook:
    """Turns tyro's parse-error events into one-line ConfigErrors (unknown events fall through)."""

    def __init__(self, args: list[str], command: str, unknown: Callable[[list[str]], str] | None,
                 flags: Sequence[str] = (), positional: dict[str, str] | None = None) -> None:
        self.args, self.unknown, self.flags, self.positional = args, unknown, flags, positional or {}
        self.prefix = f"{command}: " if command else ""
        self.see = f"(see {PROG} {command} --help)" if command else f"(see {PROG} --help)"

    def __call__(self, event: Any) -> None:
        try:
            message = self.message(event)
        except AttributeError:  # pragma: no cover - an event shaped otherwise in another tyro
            return
        if message is not None:
            raise ConfigError(self.prefix + message)

    def message(self, event: Any) -> str | None:
        see = self.see
        named = [a for a in self.args if a.startswith("--") and a[2:].partition("=")[0].replace("-", "_") in self.positional]
        if named:  # a positional argument given as an option (tyro reports it as a missing value, or unknown)
            return f"unknown option {named[0].partition('=')[0]}{self.hint(named[0])} {see}"
        if isinstance(event, tyro_errors.UnrecognizedArgs):
            if self.unknown is not None:
                return self.unknown(list(event.tokens))
            options = [t for t in event.tokens if t.startswith("-")]
            if options:
                what = f"option {options[0]}" if len(options) == 1 else f"options {' '.join(options)}"
                return f"unknown {what}{self.hint(options[0])} {see}"
            after = _flag_before(self.args, list(event.tokens)[0]) if event.tokens else None
            if after is not None:
                return (f"{after} = {list(event.tokens)[0]!r} is invalid: {after} is a switch and takes no value "
                        f"(give {after} alone, or its --no- form) {see}")
            return f"unexpected argument(s) {list(event.tokens)} {see}"
        if isinstance(event, tyro_errors.MissingArgs):
            names = [_name(a.arg) for a in event.missing_arguments]
            return f"{' '.join(names)} is required {see}" if len(names) == 1 else f"{', '.join(names)} are required {see}"
        if isinstance(event, tyro_errors.MissingSubcommand):
            return f"a command is required: one of {', '.join(event.subcommand_spec.parser_from_name)} {see}"
        if isinstance(event, tyro_errors.InvalidChoice):
            return f"{_name(event.argument)} = {event.value!r} is invalid: must be one of {', '.join(event.choices)}"
        if isinstance(event, tyro_errors.BadValue) and event.reason == "too_few_values":
            return f"{_name(event.argument)} needs a value {see}"
        if isinstance(event, tyro_errors.InstantiationFailure):
            return self.invalid(event.argument, event.message)
        return None

    def hint(self, option: str) -> str:
        """What to do instead of the unknown `option`: give a positional field's values without
        its name (`compare --run-dirs A B` -> `compare A B`), or the nearest flags."""
        name = option.partition("=")[0].lstrip("-").replace("-", "_")
        if name in self.positional:
            metavar = self.positional[name]
            return f"; {metavar} is positional: give the value(s) without {option.partition('=')[0]}"
        return did_you_mean_flag(option, self.flags)

    def invalid(self, argument: Any, message: str) -> str:
        """The line of a value that did not convert (a failed check: its own message)."""
        message = " ".join(message.split())
        if argument is None:
            return message
        flags = list(argument.lowered.name_or_flags) or [_name(argument)]
        kind = _kind(argument.field.type_stripped) if argument.lowered.nargs in (None, 1, "?") else None
        value = _given_value(self.args, flags)
        if kind is None or value is None:
            return f"{flags[0]}: {message}"
        return f"{flags[0]} = {value!r} is invalid: must be {kind}"


def _flag_before(args: Sequence[str], token: str) -> str | None:
    """The flag just before the first `token` in `args` (a value given to a switch), else None."""
    if token in args:
        i = list(args).index(token)
        if i > 0 and args[i - 1].startswith("--") and "=" not in args[i - 1]:
            return args[i - 1]
    return None


def _given_value(args: Sequence[str], flags: Sequence[str]) -> str | None:
    """The value given to a one-value option (`--flag V` or `--flag=V`), for the error line."""
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if arg in flags and i + 1 < len(args):
            return args[i + 1]
        if eq and name in flags:
            return inline
    return None


def _name(argument: Any) -> str:
    """How the help names an argument: its flag, or a positional's metavar."""
    flags = list(argument.lowered.name_or_flags)
    if flags and flags[0].startswith("-"):
        return flags[0]
    return argument.lowered.metavar or argument.field.intern_name.upper()


def _kind(annotation: Any) -> str | None:
    """"an integer" / "a number" for int / float annotations (optional or not), else None."""
    names = re.findall(r"\b(int|float)\b", str(getattr(annotation, "__name__", annotation)))
    if "int" in names and "float" not in names:
        return "an integer"
    if "float" in names:
        return "a number"
    return None
