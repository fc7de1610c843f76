"""The command-line reference says what the parsers accept, and every pointer a help text makes
leads somewhere (issue 40 items 9 and 10).

- docs/reference/cli.md is generated from the parsers tyro builds (positional arguments shown
  as such: `compare RUN_DIR [RUN_DIR ...]`, never `--run-dirs`), and every argument it documents
  is accepted by its command's parser;
- the "did you mean" of an unknown option never proposes the option that was refused, and a
  positional argument given as an option says it is positional;
- every pointer in a help text or a config field's docstring - `README "Section"` or a
  `docs/....md` page - names a README heading or a docs page that exists.
"""

from __future__ import annotations

import glob
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_MD = os.path.join(ROOT, "docs", "reference", "cli.md")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _gen_pages():
    sys.path.insert(0, os.path.join(ROOT, "docs"))
    try:
        import gen_pages
    finally:
        sys.path.remove(os.path.join(ROOT, "docs"))
    return gen_pages


def _documented() -> dict[str, list[str]]:
    """command -> the first cell of each argument row of its section in cli.md (the argument as written)."""
    with open(CLI_MD, encoding="utf-8") as f:
        text = f.read()
    out: dict[str, list[str]] = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        name = re.match(r"`(\w+)`", section).group(1)
        out[name] = [m.group(1) for m in re.finditer(r"^\| `([^`]+)`", section, flags=re.M)]
    return out


def _parse(argv: list[str]) -> str:
    """'' when `parse_command(argv)` accepts the command line, else its one-line error."""
    from ppo_async.cli.dispatch import parse_command
    from ppo_async.errors import ConfigError

    try:
        parse_command(argv)
    except ConfigError as exc:
        return str(exc)
    return ""


def _value(metavar: str) -> list[str]:
    """A value an argument's metavar asks for (a choice's first, a number, a word)."""
    choice = re.match(r"\{([^}]*)\}", metavar)
    if choice:
        first = choice.group(1).split(",")[0]
        return [first if first != "None" else "1"]
    return ["1"] if re.search(r"INT|FLOAT|\bN\b|\bI\b|\bS\b|\bX\b|PORT", metavar) else ["a"]


NEEDS = {"eval": ["run_a"], "plot": ["run_a"], "compare": ["run_a"], "launch": ["--num-processes", "2"]}


def test_cli_reference_is_what_the_parsers_give():
    with open(CLI_MD, encoding="utf-8") as f:
        assert f.read() == _gen_pages().cli_page(), "run python docs/gen_pages.py"


def test_positional_arguments_are_documented_as_such():
    documented = _documented()
    for name in ("plot", "compare"):
        assert documented[name][0] == "RUN_DIR [RUN_DIR ...]", documented[name]
        assert not any("run-dirs" in arg for arg in documented[name])
    assert documented["eval"][0] == "RUN_DIR"
    with open(CLI_MD, encoding="utf-8") as f:
        text = f.read()
    assert "python -m ppo_async compare RUN_DIR [RUN_DIR ...] [OPTIONS]" in text


def test_every_command_is_documented():
    from ppo_async.cli.dispatch import COMMANDS

    assert list(_documented()) == list(COMMANDS)


@pytest.mark.parametrize("command", ["train", "eval", "plot", "compare", "tune", "benchmark", "launch"])
@pytest.mark.filterwarnings("ignore:.*is deprecated and goes in the next release:FutureWarning")  # --eval-every, documented
def test_every_documented_argument_is_accepted_by_its_parser(command):
    """Each documented argument, given as documented, is recognised by the command's parser (a
    refused value is fine here; an unknown option or argument is not)."""
    arguments = _documented()[command]
    assert arguments, command
    for argument in arguments:
        if not argument.startswith("--"):  # positional: `compare a b`
            argv = [command, "run_a", "run_b"] if "..." in argument else [command, "run_a"]
            argv += NEEDS["launch"] if command == "launch" else []
        else:
            for flag in argument.split(" / "):
                option, _, metavar = flag.partition(" ")
                values = [] if not metavar else _value(metavar.strip("["))
                argv = [command, *NEEDS.get(command, []), option, *values]
                if command == "launch":
                    argv += ["--", "train"]
                error = _parse(argv)
                assert "unknown option" not in error and "unexpected argument" not in error, (argv, error)
            continue
        error = _parse(argv)
        assert "unknown option" not in error and "unexpected argument" not in error, (argv, error)


def test_compare_takes_run_directories_without_a_flag():
    assert _parse(["compare", "run_a", "run_b", "--labels", "a", "b"]) == ""
    error = _parse(["compare", "--run-dirs", "run_a", "run_b"])
    assert "unknown option --run-dirs" in error and "RUN_DIR is positional" in error, error
    assert "did you mean" not in error


@pytest.mark.parametrize("command", ["train", "eval", "plot", "compare", "tune", "benchmark", "launch"])
def test_did_you_mean_never_proposes_the_refused_option(command):
    """Every field name of the command, misspelled by a letter or given as an option where it
    is positional: the hint never repeats the option refused, and proposes only this command's flags."""
    import dataclasses

    from ppo_async.cli.dispatch import COMMANDS
    from ppo_async.cli.parsing import dataclass_flags

    own = set(dataclass_flags(COMMANDS[command]))
    names = [f.name for f in dataclasses.fields(COMMANDS[command]) if f.name not in ("cfg", "preset", "given",
                                                                                        "file_fields", "train_args")]
    for name in names:
        option = "--" + name.replace("_", "-")
        for refused in ([option] if option not in own else []) + [option + "s", option[:-1]]:
            if refused in own:
                continue
            argv = [command, *NEEDS.get(command, []), refused, "1"] + (["--", "train"] if command == "launch" else [])
            error = _parse(argv)
            assert f"unknown option {refused}" in error, (argv, error)
            proposed = re.findall(r"--[\w.-]+", error.partition("did you mean")[2].partition("?")[0])
            assert refused not in proposed, error
            assert set(proposed) <= own, (error, own)


def test_did_you_mean_flag_leaves_out_the_token():
    from ppo_async.cli.parsing import did_you_mean_flag

    assert did_you_mean_flag("--run-dirs", ["--run-dirs", "--run-dir"]) == "; did you mean --run-dir?"
    assert did_you_mean_flag("--labels=a", ["--labels"]) == ""


# ------------------------------------------------------------------------------------------
# pointers in help texts and config docstrings


def _help_texts() -> list[tuple[str, str]]:
    """(where, text) of every help text: the top description, each command's, each argument's
    (train's include every Config field's docstring), and every config section's field docstrings."""
    from ppo_async.cli.dispatch import COMMANDS, DESCRIPTION
    from ppo_async.cli.parsing import PROG
    from ppo_async.config import run_config, sections

    gen_pages = _gen_pages()
    texts = [("python -m ppo_async --help", DESCRIPTION)]
    for name, cls in COMMANDS.items():
        texts.append((f"{name} --help", cls.__doc__ or ""))
        texts += [(f"{name} {a.option_strings or a.dest}", a.help or "") for a in gen_pages.cli_arguments(cls, f"{PROG} {name}")]
    for cls in (run_config.Config, sections.RolloutConfig, sections.PPOConfig, sections.NetworkConfig, sections.LagConfig,
                sections.ThreadedConfig, sections.EnvOptions, sections.DistributedConfig):
        texts.append((cls.__name__, cls.__doc__ or ""))
        texts += [(f"{cls.__name__}.{field}", doc) for field, (_, doc) in gen_pages._class_source_info(cls).items()]
    return texts


def _slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc writes it."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text).strip("-")


def _headings(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)  # a `# comment` in a code block is no heading
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)]


README_POINTER = re.compile(r"README\s*\(?\s*[\"'“]([^\"'”]+)[\"'”]")
DOCS_POINTER = re.compile(r"\bdocs/([\w./-]+\.md)(?:#([\w-]+))?")


def pointer_problems(where: str, text: str) -> list[str]:
    """What is wrong with the pointers of one help text: a README section or a docs page (or
    its anchor) that does not exist, a bare "README" naming no section, a "docs:" naming no page."""
    problems = []
    headings = _headings(os.path.join(ROOT, "README.md"))
    for match in README_POINTER.finditer(text):
        if match.group(1) not in headings:
            problems.append(f"{where}: README has no section {match.group(1)!r} (it has {headings})")
    for match in re.finditer(r"\bREADME\b", text):
        if not README_POINTER.match(text, match.start()):
            problems.append(f"{where}: 'README' names no section: {text[max(0, match.start() - 40):match.end() + 20]!r}")
    for match in DOCS_POINTER.finditer(text):
        path = os.path.join(ROOT, "docs", match.group(1))
        if not os.path.isfile(path):
            problems.append(f"{where}: no page docs/{match.group(1)}")
        elif match.group(2) and match.group(2) not in {_slug(h) for h in _headings(path)}:
            problems.append(f"{where}: docs/{match.group(1)} has no section #{match.group(2)}")
    if re.search(r"\bdocs:\s", text):
        problems.append(f"{where}: 'docs:' names no page (write its path, docs/...md)")
    return problems


def test_every_help_pointer_resolves():
    texts = _help_texts()
    assert len(texts) > 150  # every command's arguments and every config field
    pointers = sum(len(README_POINTER.findall(t)) + len(DOCS_POINTER.findall(t)) for _, t in texts)
    assert pointers >= 4  # tune, train's preset, the env backend, learner_sync at least
    problems = [p for where, text in texts for p in pointer_problems(where, text)]
    assert not problems, "\n".join(problems)


def test_pointer_check_catches_a_dangling_one():
    assert pointer_problems("x", 'the recipe (README "Tuning")')
    assert pointer_problems("x", "the env's preset (README) fills")
    assert pointer_problems("x", "see docs/how-to/nothing.md")
    assert pointer_problems("x", "see docs/how-to/tune.md#no-such-section")
    assert pointer_problems("x", "(docs: several processes)")
    assert not pointer_problems("x", 'README "Quickstart"; docs/how-to/tune.md#the-tune-command')


def test_docs_pages_exist_for_the_pointers():
    assert glob.glob(os.path.join(ROOT, "docs", "how-to", "*.md"))


def _package_texts() -> list[tuple[str, str]]:
    """(where, text) of every docstring and string constant in ppo_async's source that names
    README or a docs/ page (read with ast: nothing is imported), e.g. a module docstring or a
    benchmark suite's description."""
    import ast

    texts = []
    for root, _, files in os.walk(os.path.join(ROOT, "ppo_async")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            where = os.path.relpath(path, ROOT)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"README|docs/", node.value):
                    texts.append((f"{where}:{node.lineno}", node.value))
    return texts


def test_every_pointer_in_the_package_source_resolves():
    """Docstrings and texts outside the help (launch's module docstring, the plots module's,
    a suite's description) point somewhere too."""
    texts = _package_texts()
    assert any("launch.py" in where for where, _ in texts) and any("suites.py" in where for where, _ in texts)
    problems = [p for where, text in texts for p in pointer_problems(where, text)]
    assert not problems, "\n".join(problems)
