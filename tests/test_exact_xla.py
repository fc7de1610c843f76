"""The `exact_xla` tests run in exactly one of the two pytest invocations of the test command
(tests/conftest.py): the main run skips each of them with a reason that names the second
invocation, which runs them (and only them) under XLA's default code generation. No test is
silently left out of both."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

from conftest import EXACT_XLA_COMMAND, EXACT_XLA_ENV, REPO_ROOT, exact_xla_skip_reason


def test_the_skip_reason_names_the_second_invocation_and_only_exact_tests_skip():
    reason = exact_xla_skip_reason(marked=True, exact_run=False)
    assert reason is not None and EXACT_XLA_COMMAND in reason
    assert exact_xla_skip_reason(marked=True, exact_run=True) is None  # the second invocation runs them
    assert exact_xla_skip_reason(marked=False, exact_run=False) is None  # every other test runs in the main one
    assert EXACT_XLA_COMMAND == f"{EXACT_XLA_ENV}=1 python -m pytest -q -m exact_xla"


def test_the_test_command_of_readme_and_ci_ends_with_the_second_invocation():
    for page in ("README.md", os.path.join(".ci", "run")):
        with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.startswith('pip install -e ".[dev]" && python -m pytest')]
        assert len(lines) == 1 and lines[0].endswith(" && " + EXACT_XLA_COMMAND), (page, lines)


def _modules_with_exact_tests() -> list[str]:
    """The test modules that mark tests `exact_xla` (their text names the mark)."""
    here = os.path.basename(__file__)
    return sorted(os.path.relpath(p, REPO_ROOT) for p in glob.glob(os.path.join(REPO_ROOT, "tests", "test_*.py"))
                  if os.path.basename(p) != here and "pytest.mark.exact_xla" in open(p, encoding="utf-8").read())


def _pytest(args: list[str], exact: bool) -> subprocess.CompletedProcess:
    """`python -m pytest ARGS` in the repository, as the main invocation or the exact one."""
    env = {k: v for k, v in os.environ.items() if k != EXACT_XLA_ENV and not k.startswith("PYTEST_XDIST")}
    if exact:
        env[EXACT_XLA_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _as_junit_name(nodeid: str) -> tuple[str, str]:
    """A node id `tests/test_a.py::Class::test_b[x]` as JUnit's (classname, name)."""
    path, *inner, name = nodeid.split("::")
    return ".".join([path[: -len(".py")].replace("/", "."), *inner]), name


def test_each_exact_test_runs_in_exactly_one_invocation(tmp_path):
    """The exact tests the second invocation selects are exactly those the main one skips, each
    with the reason naming the second (the main run skips before any fixture is built)."""
    modules = _modules_with_exact_tests()
    assert modules, "no module marks a test exact_xla: drop the second invocation, or this test"
    collected = _pytest(["--collect-only", "-q", "-m", "exact_xla", *modules], exact=True)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    exact = {_as_junit_name(line.strip()) for line in collected.stdout.splitlines() if "::" in line}
    assert exact
    report = tmp_path / "main.xml"
    main = _pytest(["-q", "-m", "exact_xla", f"--junitxml={report}", *modules], exact=False)
    assert main.returncode == 0, main.stdout[-3000:] + main.stderr[-3000:]
    cases = ElementTree.parse(report).getroot().iter("testcase")
    skipped = {}
    for case in cases:
        outcome = [child for child in case if child.tag in ("skipped", "failure", "error")]
        assert [c.tag for c in outcome] == ["skipped"], ElementTree.tostring(case, encoding="unicode")
        skipped[(case.get("classname"), case.get("name"))] = outcome[0].get("message", "")
    assert set(skipped) == exact
    assert all(EXACT_XLA_COMMAND in message for message in skipped.values()), skipped
