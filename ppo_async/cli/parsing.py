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
from typing import Any, Callable, Iterator, Sequence

import tyro

from ppo_async.errors import ConfigError

try:  # tyro >= 1.0; older versions print their box, flattened below
    from tyro import _errors as tyro_errors
except ImportError:  # pragma: no cover - depends on the installed tyro
    tyro_errors = None

PROG = "python -m ppo_async"


def parse(target: Any, args: Sequence[str], prog: str = PROG, *, command: str = "", default: Any = tyro.MISSING_NONPROP,
          description: str | None = None, unknown: Callable[[list[str]], str] | None = None,
          return_unknown_args: bool = False, add_help: bool = True) -> Any:
    """`tyro.cli(target, args=args, ...)`; a rejected command line raises ConfigError with one
    line, prefixed `COMMAND: ` when `command` is given (`unknown(tokens)` for unrecognised
    arguments, when given). `--help` prints the help and raises SystemExit(0), as tyro does."""
    captured = io.StringIO()
    hook = _Hook(list(args), command, unknown, dataclass_flags(target))
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


def dataclass_flags(target: Any, prefix: str = "") -> list[str]:
    """Every flag of the dataclasses in `target` (a dataclass, or a Union / Annotated of them,
    as tyro reads it): nested sections as `--section.field`, a section named "" flattened."""
    if dataclasses.is_dataclass(target):
        flags = []
        try:
            hints = typing.get_type_hints(target, include_extras=True)
        except NameError:  # an annotation naming what its module imports only for type checkers
            hints = {}
        for f in dataclasses.fields(target):
            hint = hints.get(f.name, f.type)
            inner = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
            name = "" if any(getattr(m, "name", None) == "" for m in typing.get_args(hint)[1:]) else f.name
            if dataclasses.is_dataclass(inner):
                flags += dataclass_flags(inner, f"{prefix}{name}." if name else prefix)
            else:
                flags.append(flag_of(prefix + f.name))
        return flags
    return [flag for arg in typing.get_args(target) for flag in dataclass_flags(arg, prefix)]


def did_you_mean_flag(token: str, flags: Sequence[str]) -> str:
    """`"; did you mean --ppo.gamma?"` for the flags nearest to `token` (difflib), else `""`."""
    close = difflib.get_close_matches(token.partition("=")[0], list(dict.fromkeys(flags)), n=3, cutoff=0.6)
    return "; did you mean " + " or ".join(close) + "?" if close else ""


_ASSIGNMENT = re.compile(r"^(?:[a-z]+: )?([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*) = ")


def as_command_line(message: str, fields: Sequence[str]) -> str:
    """A ConfigError's message in the command line's words: a leading `COMMAND: ` dropped and a
    leading `field = ` naming one of `fields` (dotted) written as its flag:
    `"train: ppo.clip_eps = 2.0 is invalid: ..."` -> `"--ppo.clip-eps = 2.0 is invalid: ..."`."""
    message = re.sub(r"^[a-z]+: (?=--[\w.-]+ = )", "", message)
    match = _ASSIGNMENT.match(message)
    if match is None or match.group(1) not in fields:
        return message
    return flag_of(match.group(1)) + message[match.end(1):]


def flatten(box: str) -> str:
    """tyro's error box as one line: no box drawing, no help footer, whitespace collapsed."""
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", box).split())
    return re.sub(r"\s*For full helptext, (run|see) .*$", "", text).strip()


class _Hook:
    """Turns tyro's parse-error events into one-line ConfigErrors (unknown events fall through)."""

    def __init__(self, args: list[str], command: str, unknown: Callable[[list[str]], str] | None,
                 flags: Sequence[str] = ()) -> None:
        self.args, self.unknown, self.flags = args, unknown, flags
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
        if isinstance(event, tyro_errors.UnrecognizedArgs):
            if self.unknown is not None:
                return self.unknown(list(event.tokens))
            options = [t for t in event.tokens if t.startswith("-")]
            if options:
                what = f"option {options[0]}" if len(options) == 1 else f"options {' '.join(options)}"
                return f"unknown {what}{did_you_mean_flag(options[0], self.flags)} {see}"
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
