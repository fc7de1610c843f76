"""The documentation cannot drift from the code (issue 28).

- every ```bash and ```python block of README.md and docs/**/*.md runs, page by page, in order,
  in a scratch directory (with `experiments/` and `notebooks/` linked in), with these rules
  (docs/index.md "Contributing to these pages" states them for writers):
    - `<!-- docs-test: total-env-steps=N -->` on the line before a block runs its
      `python -m ppo_async ...` commands with `--total-env-steps N` (added or replaced) and its
      Python with `total_env_steps=N`: the page shows the real budget, the test a tiny one;
    - a block whose comment line starts with `# not run by the docs test:` is skipped, the
      reason visible on the page (there are few: `test_few_blocks_are_skipped`);
    - `pip install ...` is not run (the suite runs in an installed environment);
- the generated pages and README's benchmark table equal what docs/gen_pages.py makes now;
- `mkdocs build --strict` passes (broken links, anchors, missing pages, pages left out of
  the nav, bad mkdocstrings references fail it);
- README stays a front page (<= 200 lines) whose links resolve inside the repository.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs"))

SKIP_MARK = "# not run by the docs test:"
SHRINK = re.compile(r"<!--\s*docs-test:\s*total-env-steps=(\d+)\s*-->")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
PPO_COMMAND = re.compile(r"python -m ppo_async (train|benchmark|tune|launch)\b")
MAX_SKIPPED = 10


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    shrink: int | None
    skip: str | None  # the reason, for a block that is not run


def doc_pages() -> list[str]:
    pages = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return [p.replace(os.sep, "/") for p in pages]


def blocks_of(page: str) -> list[Block]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    out = []
    for match in FENCE.finditer(text):
        lang, code = match.group(1), match.group(2)
        if lang not in ("bash", "python"):
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        shrink = SHRINK.search(before)
        skip = next((line.strip()[len(SKIP_MARK):].strip() for line in code.splitlines() if line.strip().startswith(SKIP_MARK)), None)
        out.append(Block(page, text[: match.start()].count("\n") + 1, lang, code,
                         int(shrink.group(1)) if shrink else None, skip))
    return out


def _shrink_command(line: str, steps: int) -> str:
    """`--total-env-steps` of a `python -m ppo_async` command line set to `steps` (added before
    a trailing comment when the line has none)."""
    if not PPO_COMMAND.search(line):
        return line
    if re.search(r"--total-env-steps[ =]\d+", line):
        return re.sub(r"--total-env-steps([ =])\d+", rf"--total-env-steps\g<1>{steps}", line)
    if "--resume" in line or "--report-only" in line:
        return line
    command, hash_, comment = line.partition(" #")
    return f"{command.rstrip()} --total-env-steps {steps}" + (f"  #{comment}" if hash_ else "")


def runnable_bash(block: Block) -> str:
    lines = []
    for line in block.code.replace("\\\n", " ").splitlines():
        line = re.sub(r"^\s*pip install [^&]*&&\s*", "", line)  # installed already
        if re.match(r"^\s*pip install ", line):
            continue
        if block.shrink is not None:
            line = _shrink_command(line, block.shrink)
        lines.append(line)
    return "\n".join(lines) + "\n"


def runnable_python(block: Block) -> str:
    code = block.code
    if block.shrink is not None:
        code = re.sub(r"total_env_steps=[\d_]+", f"total_env_steps={block.shrink}", code)
    return code


PAGES = [p for p in doc_pages() if any(b.skip is None for b in blocks_of(p))]


IN_PROCESS = re.compile(r"^python -m ppo_async (?P<args>[^#&|;<>$`]*?)(?P<refused>\s*&&\s*exit 1)?\s*(#.*)?$")


def in_process_commands(code: str) -> list[tuple[list[str], bool]] | None:
    """The `python -m ppo_async ARGS` commands of a bash block as (ARGS, refused) pairs, when
    the block holds nothing else (comments aside; `CMD && exit 1` = CMD must fail); else None."""
    import shlex

    commands = []
    for line in code.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = IN_PROCESS.match(line)
        if match is None:
            return None
        commands.append((shlex.split(match.group("args")), bool(match.group("refused"))))
    return commands


def run_page(page: str, work_dir: str) -> None:
    """Runs a page's blocks in order in this process (`python tests/test_docs.py PAGE DIR`, or
    the page runner's `serve`):
    python blocks in one namespace, as pasted into one session; bash blocks made only of
    `python -m ppo_async` commands through `ppo_async.cli.main` (one JAX start per page, the
    compiled programs shared, as `tests/conftest.py`'s cli_main does); other bash blocks in bash."""
    from ppo_async.runtime.xla_flags import apply_cpu_workarounds

    apply_cpu_workarounds()  # as `python -m ppo_async` does, before JAX starts
    os.chdir(work_dir)
    namespace: dict = {"__name__": "__main__"}
    for block in blocks_of(page):
        if block.skip is not None:
            continue
        where = f"{block.page}:{block.line}"
        print(f"=== {where} ({block.lang})", flush=True)
        if block.lang == "python":
            exec(compile(runnable_python(block), where, "exec"), namespace)
            continue
        script = runnable_bash(block)
        commands = in_process_commands(script)
        if commands is None:
            subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], check=True)
            continue
        from ppo_async.cli import main

        for args, refused in commands:
            print(f"--- python -m ppo_async {' '.join(args)}", flush=True)
            try:
                status = main(args)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
            if (status == 0) == refused:
                raise SystemExit(f"{where}: python -m ppo_async {' '.join(args)} exited with status {status}"
                                 + (" (the page says it is refused)" if refused else ""))


class PageRunner:
    """One interpreter that runs pages one after another (`serve`), for the pages a test worker
    gets: JAX starts once and the programs the pages share are traced once, as a user's session
    pasting them would. Each page still runs in its own scratch directory and namespace, its
    output in its own log. A page that kills the interpreter fails alone: the next starts a new one."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        env = dict(os.environ)
        env.update(MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], env=env, cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def run(self, page: str, work_dir: str, log: str, timeout_s: float = 600) -> str | None:
        """Runs `page` in `work_dir`, its output to `log`; None when every block ran, else why not."""
        import json
        import selectors

        if self.proc is None or self.proc.poll() is not None:
            self.proc = self.start()
        self.proc.stdin.write(json.dumps({"page": page, "work_dir": work_dir, "log": log}) + "\n")
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:  # it died, or hangs: the next page gets a new interpreter
            self.close()
            return "the page runner " + ("ended" if ready else f"did not answer in {timeout_s:.0f} s")
        return json.loads(line)["error"]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def serve() -> None:
    """The page runner's loop (`python tests/test_docs.py --serve`): one JSON request per line on
    stdin, `run_page` with stdout and stderr (file descriptors 1 and 2, so bash blocks' output
    too) in the request's log, one JSON answer per line on the original stdout."""
    import json
    import traceback

    from ppo_async.runtime.xla_flags import apply_cpu_workarounds

    apply_cpu_workarounds()  # as `python -m ppo_async` does, before JAX starts
    answers, requests = os.fdopen(os.dup(1), "w"), os.fdopen(os.dup(0), "r")
    with open(os.devnull, encoding="utf-8") as nothing:  # a page (or its bash) reading stdin gets nothing, not a request
        os.dup2(nothing.fileno(), 0)
    for request in requests:
        request = json.loads(request)
        with open(request["log"], "w", encoding="utf-8") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            error = None
            try:
                run_page(request["page"], request["work_dir"])
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the test
                traceback.print_exc()
                error = f"{type(exc).__name__}: {exc}"
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                if "matplotlib.pyplot" in sys.modules:
                    sys.modules["matplotlib.pyplot"].close("all")
                os.chdir(ROOT)
        answers.write(json.dumps({"error": error}) + "\n")
        answers.flush()


@pytest.fixture(scope="session")
def page_runner():
    runner = PageRunner()
    yield runner
    runner.close()


@pytest.mark.parametrize("page", PAGES)
def test_doc_blocks_run(page, tmp_path, page_runner):
    """Runs the page's blocks in order, in a scratch directory (`run_page`), in this worker's page runner."""
    for name in ("experiments", "notebooks"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    log = tmp_path / "page.log"
    error = page_runner.run(page, str(tmp_path), str(log))
    if error is not None:
        output = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        pytest.fail(f"{page}: a block failed ({error})\n--- output ---\n{output[-10000:]}", pytrace=False)


def test_the_page_runner_reports_a_failing_page_and_outlives_a_dead_one(tmp_path):
    """A page that raises fails with its error and output; one that ends the interpreter fails
    alone: the next page runs in a new one."""
    pages = {"ok": 'print("hello")', "raises": 'raise ValueError("boom")', "dies": "import os\nos._exit(3)"}
    for name, code in pages.items():
        (tmp_path / f"{name}.md").write_text(f"# {name}\n\n```python\n{code}\n```\n", encoding="utf-8")
    runner = PageRunner()
    try:
        said = {name: runner.run(str(tmp_path / f"{name}.md"), str(tmp_path), str(tmp_path / f"{name}.log"))
                for name in ("ok", "raises", "dies")}
        assert runner.run(str(tmp_path / "ok.md"), str(tmp_path), str(tmp_path / "again.log")) is None
    finally:
        runner.close()
    assert said == {"ok": None, "raises": "ValueError: boom", "dies": "the page runner ended"}
    assert (tmp_path / "ok.log").read_text().rstrip().endswith("hello")
    assert "ValueError: boom" in (tmp_path / "raises.log").read_text()
    assert (tmp_path / "again.log").read_text().rstrip().endswith("hello")


def test_few_blocks_are_skipped():
    """Blocks that do not run say why, and there are few of them."""
    skipped = [b for p in doc_pages() for b in blocks_of(p) if b.skip is not None]
    for b in skipped:
        assert len(b.skip) > 20, f"{b.page}:{b.line}: give the reason after {SKIP_MARK!r}"
    assert len(skipped) <= MAX_SKIPPED, [f"{b.page}:{b.line}" for b in skipped]
    assert sum(b.skip is None for p in doc_pages() for b in blocks_of(p)) >= 3 * len(skipped)


def test_in_process_commands():
    assert in_process_commands("# c\npython -m ppo_async train --env A  # x\npython -m ppo_async train --quiet && exit 1\n") == \
        [(["train", "--env", "A"], False), (["train", "--quiet"], True)]
    assert in_process_commands("cat > a <<'EOF'\nx\nEOF\npython -m ppo_async train\n") is None


def test_shrink_rules():
    block = Block("x", 1, "bash", "", 4096, None)
    assert _shrink_command("python -m ppo_async train --env A  # a comment", 4096) == \
        "python -m ppo_async train --env A --total-env-steps 4096  # a comment"
    assert _shrink_command("python -m ppo_async train --total-env-steps 40960 --quiet", 8) == \
        "python -m ppo_async train --total-env-steps 8 --quiet"
    assert _shrink_command("python -m ppo_async train --resume runs/cp", 8) == "python -m ppo_async train --resume runs/cp"
    assert runnable_bash(dataclasses.replace(block, code="pip install -e . && python -m ppo_async train\n")) == \
        "python -m ppo_async train --total-env-steps 4096\n"
    assert runnable_python(dataclasses.replace(block, lang="python", code="pa.Config(total_env_steps=100_000)")) == \
        "pa.Config(total_env_steps=4096)"


def test_generated_pages_are_current():
    """docs/reference/*, docs/results/* and README's benchmark table are what the code and the
    committed results give now (`python docs/gen_pages.py` rewrites them)."""
    import gen_pages

    problems = gen_pages.stale()
    assert not problems, "\n".join(problems + ["run `python docs/gen_pages.py` and commit the result"])


def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def test_readme_is_a_front_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert text.count("\n") <= 200
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    ci_command = re.search(r'^(pip install -e "\.\[dev\]" && python -m pytest[^\n]*)$', ci, re.M).group(1)
    assert ci_command in text, "README's test command must be exactly what .ci/run runs"


@pytest.mark.parametrize("page", ["README.md", "CHANGELOG.md"])
def test_links_stay_in_the_repository(page):
    """Relative links of the pages GitHub shows (not built by mkdocs) name files that exist;
    nothing links to files outside the repository."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"https?://", target):
            continue
        path = target.split("#")[0]
        assert path and os.path.exists(os.path.join(ROOT, path)), f"{page}: link to {target!r}: no such file"
        assert os.path.realpath(os.path.join(ROOT, path)).startswith(ROOT + os.sep), f"{page}: {target!r} leaves the repository"
    for page_ in doc_pages() + ["CHANGELOG.md"]:
        with open(os.path.join(ROOT, page_), encoding="utf-8") as f:
            assert "MEASURED.md" not in f.read(), f"{page_} names MEASURED.md, which is not in the repository"


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        run_page(sys.argv[1], sys.argv[2])
