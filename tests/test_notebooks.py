"""Executes the notebooks in notebooks/ top to bottom (nbclient, a python3 kernel on this
interpreter) at a small budget injected into each notebook's first "parameters" cell, and
checks that no cell errored and that tables and figures were produced."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(REPO_ROOT, "notebooks")
KERNEL_NAME = "ppo-async-test"
TEST_BUDGET = 10_000  # env steps per seed (default budgets: 60k quickstart, 100k sweep, 150k per threaded run)


@pytest.fixture
def kernel_name(tmp_path_factory, monkeypatch):
    """A throwaway kernel spec that runs ipykernel on *this* interpreter (so the kernel sees
    the same installed packages as the test, whatever the global `python3` spec points to),
    with this checkout first on its path (so it tests this tree's `ppo_async`)."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ppo_async test kernel",
        "language": "python",
        # the checkout under test, whatever the editable install points at
        "env": {"PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH", "")]))},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(root) + os.pathsep + os.environ.get("JUPYTER_PATH", ""))
    return KERNEL_NAME


def load_with_budget(name: str, budget: int):
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    params = code_cells[0]
    assert "parameters" in params.metadata.get("tags", []), f"{name}: first code cell must be tagged 'parameters'"
    assert re.search(r"^TOTAL_ENV_STEPS\s*=", params.source, re.M), f"{name}: parameters cell must set TOTAL_ENV_STEPS"
    params.source = re.sub(r"^TOTAL_ENV_STEPS\s*=.*$", f"TOTAL_ENV_STEPS = {budget:_}", params.source, flags=re.M)
    return nb


def execute(nb, kernel_name: str, cwd) -> float:
    client = nbclient.NotebookClient(
        nb, kernel_name=kernel_name, timeout=240, resources={"metadata": {"path": str(cwd)}}
    )
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    return time.perf_counter() - t0


def outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def text_of(nb) -> str:
    parts = []
    for out in outputs(nb):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
    return "\n".join(parts)


def count_mime(nb, mime: str) -> int:
    return sum(1 for out in outputs(nb) if out.output_type in ("execute_result", "display_data") and mime in out.data)


def assert_clean(nb, name: str) -> None:
    errors = [out for out in outputs(nb) if out.output_type == "error"]
    assert not errors, f"{name}: {errors[0].ename}: {errors[0].evalue}"
    stderr = "".join(out.text for out in outputs(nb) if out.output_type == "stream" and out.name == "stderr")
    assert "Traceback" not in stderr, f"{name} wrote a traceback to stderr:\n{stderr}"


def test_committed_without_outputs():
    for name in sorted(os.listdir(NOTEBOOKS)):
        if name.endswith(".ipynb"):
            nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
            for cell in nb.cells:
                if cell.cell_type == "code":
                    assert not cell.outputs and cell.execution_count is None, f"{name}: commit it with outputs cleared"


def test_quickstart(kernel_name, tmp_path):
    nb = load_with_budget("01_quickstart.ipynb", TEST_BUDGET)
    seconds = execute(nb, kernel_name, tmp_path)
    assert_clean(nb, "01_quickstart")
    text = text_of(nb)
    rows = re.search(r"^(\d+) rows, (\d+) seeds", text, re.M)
    assert rows and int(rows.group(1)) > 0 and int(rows.group(2)) == 2, text
    assert "final_return_mean" in text and "steps_to_threshold" not in text  # pa.summarize, no threshold given
    assert count_mime(nb, "text/html") >= 3  # DataFrame head and the two pa.summarize tables
    assert count_mime(nb, "image/png") >= 2  # learning curve and KL over time
    print(f"01_quickstart at {TEST_BUDGET} env steps: {seconds:.1f} s")


def test_lag_sweep(kernel_name, tmp_path):
    nb = load_with_budget("02_lag_sweep.ipynb", TEST_BUDGET)
    seconds = execute(nb, kernel_name, tmp_path)
    assert_clean(nb, "02_lag_sweep")
    text = text_of(nb)
    assert re.search(r"sweep: [1-9]\d* rows", text), text
    assert "'compiles': 1" in text, text  # the whole lag.K x dual_clip grid shares one compile
    assert count_mime(nb, "text/html") >= 2  # head and the groupby table
    assert count_mime(nb, "image/png") >= 4  # return/KL vs K, learning curves, kl_per_lag, lag histogram
    print(f"02_lag_sweep at {TEST_BUDGET} env steps: {seconds:.1f} s")


def test_threaded_async(kernel_name, tmp_path):
    nb = load_with_budget("03_threaded_async.ipynb", TEST_BUDGET)
    seconds = execute(nb, kernel_name, tmp_path)
    assert_clean(nb, "03_threaded_async")
    text = text_of(nb)
    for run in ("async", "barrier", "async_max_lag_1"):
        m = re.search(rf"^{run}: (\d+) learner iterations", text, re.M)
        assert m and int(m.group(1)) > 0, text
        # the notebook asserts produced = consumed + dropped + resident on every row, then prints this
        m = re.search(rf"^{run}: accounting identity produced = consumed \+ dropped \+ resident holds on all (\d+) rows", text, re.M)
        assert m and int(m.group(1)) > 0, text
    assert re.search(r"^barrier: every consumed sample had lag 0 \([1-9]\d* batches of 4 rollouts", text, re.M), text
    # per-sampler time split, for the async run and the barrier run
    assert re.search(r"^async: straggler \(sampler 3\) \d+% in simulated latency", text, re.M), text
    assert re.search(r"^barrier: straggler \(sampler 3\) \d+% in simulated latency", text, re.M), text
    assert "forced refreshes per sampler: [" in text
    # the async-vs-barrier table: one row per run, throughput and KL columns
    tables = [
        out.data["text/plain"]
        for out in outputs(nb)
        if out.output_type == "execute_result" and "text/html" in out.data and "env steps/s" in out.data.get("text/plain", "")
    ]
    assert len(tables) == 1, tables
    for label in ("async", "barrier", "async, max_lag=1", "mean approx_kl", "produced/s"):
        assert label in tables[0], tables[0]
    assert count_mime(nb, "text/html") >= 5  # lag columns, per-sampler lag, time split, drops, comparison
    assert count_mime(nb, "image/png") >= 8  # lag hist, kl_per_lag, throughput, 2 time splits, max_lag hist, 2 learning curves
    print(f"03_threaded_async at {TEST_BUDGET} env steps: {seconds:.1f} s")
