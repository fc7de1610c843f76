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


def _run(args: list[str], cwd: str, what: str, timeout: float = 600) -> None:
    env = dict(os.environ)
    env.update(MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONUNBUFFERED="1")
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed with status {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
                    f"--- stderr ---\n{proc.stderr[-6000:]}", pytrace=False)


@pytest.mark.parametrize("page", PAGES)
def test_doc_blocks_run(page, tmp_path):
    """Runs the page's bash and python blocks in order; consecutive python blocks share one
    interpreter (one JAX start), as a reader pasting them into one session would."""
    for name in ("experiments", "notebooks"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    pending: list[Block] = []

    def flush() -> None:
        if pending:
            script = "\n".join(f"# --- {b.page}:{b.line}\n{runnable_python(b)}" for b in pending)
            where = ", ".join(f"{b.page}:{b.line}" for b in pending)
            _run([sys.executable, "-c", script], str(tmp_path), f"python block(s) at {where}")
            pending.clear()

    for block in blocks_of(page):
        if block.skip is not None:
            continue
        if block.lang == "python":
            pending.append(block)
            continue
        flush()
        _run(["bash", "-e", "-o", "pipefail", "-c", runnable_bash(block)], str(tmp_path), f"bash block at {page}:{block.line}")
    flush()


def test_few_blocks_are_skipped():
    """Blocks that do not run say why, and there are few of them."""
    skipped = [b for p in doc_pages() for b in blocks_of(p) if b.skip is not None]
    for b in skipped:
        assert len(b.skip) > 20, f"{b.page}:{b.line}: give the reason after {SKIP_MARK!r}"
    assert len(skipped) <= MAX_SKIPPED, [f"{b.page}:{b.line}" for b in skipped]
    assert sum(b.skip is None for p in doc_pages() for b in blocks_of(p)) >= 3 * len(skipped)


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
