"""`python -m ppo_async compare` / `plot --labels` on two tiny runs trained in this process, the
throughput smoothing (a hand-computed rolling mean) and legends placed outside the axes."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import ppo_async as pa
from ppo_async.report import plots, run_plots
from ppo_async.cli import main
from ppo_async.cli.tools import summary_text

NAN = float("nan")
TINY = dict(env="CartPole-v1", total_env_steps=256, rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
            ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """runs/base (sync, 2 seeds) and runs/lag2 (simulated, fixed lag 2), 4 iterations each."""
    root = tmp_path_factory.mktemp("cmp") / "runs"
    pa.train(pa.Config(num_seeds=2, run_dir=str(root / "base"), plots=True, **TINY))
    pa.train(pa.Config(mode="simulated", lag=pa.LagConfig(K=2), run_dir=str(root / "lag2"), **TINY))
    return root / "base", root / "lag2"


def assert_png(path) -> None:
    assert os.path.getsize(path) > 0
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 100


def table_rows(out: str) -> dict[str, list[str]]:
    """The printed summary table: label -> the tokens of its line, plus "header"."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["num_seeds"])
    rows = {"header": lines[start].split()}
    for line in lines[start + 2 :]:  # the header, then the index name line ("run")
        tokens = line.split()
        rows[tokens[0]] = tokens[1:]
    return rows


def test_compare_writes_overlays_and_prints_summarize(two_runs, tmp_path, capsys):
    base, lag2 = two_runs
    out = tmp_path / "cmp"
    assert main(["compare", str(base), str(lag2), "--labels", "sync", "lagged", "--out", str(out), "--threshold", "15"]) == 0
    printed = capsys.readouterr().out
    for name in plots.COMPARE_FILES:
        assert_png(out / name)
        assert str(out / name) in printed
    rows = table_rows(printed)
    assert set(rows) == {"header", "sync", "lagged"}
    expected = {}
    for label, run_dir in (("sync", base), ("lagged", lag2)):
        expected[label] = pa.summarize(pd.DataFrame(pa.read_jsonl(run_dir / "metrics.jsonl")), threshold=15).iloc[0]
    header = rows["header"]
    assert header == list(expected["sync"].index)
    for label, summary in expected.items():
        for column, token in zip(header, rows[label]):
            value = summary[column]
            want = value if isinstance(value, str) else ("nan" if math.isnan(value) else f"{value:.6g}")
            assert token == want, (label, column)
    # the runs' own numbers: seeds, lag, and a saved table equal to summarize's at full precision
    assert rows["sync"][header.index("num_seeds")] == "2" and rows["lagged"][header.index("num_seeds")] == "1"
    assert rows["sync"][header.index("lag_max")] == "0" and rows["lagged"][header.index("lag_max")] == "2"
    saved = pd.read_csv(out / "summary.csv", index_col="run")
    assert list(saved.index) == ["sync", "lagged"]
    for label in ("sync", "lagged"):
        for column in ("final_return_mean", "approx_kl_mean", "lag_mean_mean", "env_steps_per_s"):
            assert saved.loc[label, column] == pytest.approx(expected[label][column], rel=1e-12)


def test_compare_defaults_labels_and_out_dir(two_runs, capsys, tmp_path, monkeypatch):
    base, lag2 = two_runs
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(base), str(lag2)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == {"header", "base", "lag2"}  # the directories' names
    assert "steps_to_threshold_median" not in rows["header"]  # no --threshold
    (out,) = (tmp_path / "runs" / "compare").iterdir()  # runs/compare/<timestamp> in the working directory
    assert sorted(os.listdir(out)) == sorted([*plots.COMPARE_FILES, "summary.csv"])
    assert not (base.parent / "compare").exists()  # nothing written beside the runs given


def test_default_outputs_go_under_runs_and_a_glob_of_runs_still_names_runs(two_runs, tmp_path, monkeypatch, capsys):
    """plot and compare write runs/plots/<timestamp> and runs/compare/<timestamp> (every command's
    default output is under runs/); `compare runs/*` afterwards leaves those folders out, with a
    note, and reads the runs; a non-run folder given on its own is still an error."""
    import shutil

    base, lag2 = two_runs
    monkeypatch.chdir(tmp_path)
    for run in (base, lag2):
        shutil.copytree(run, tmp_path / "runs" / run.name)
    assert main(["compare", "runs/base", "runs/lag2"]) == 0
    assert main(["plot", "runs/base", "runs/lag2"]) == 0
    (compared,) = (tmp_path / "runs" / "compare").iterdir()
    (plotted,) = (tmp_path / "runs" / "plots").iterdir()
    assert (compared / "summary.csv").is_file() and (plotted / "learning_curve_combined.png").is_file()
    capsys.readouterr()
    globbed = sorted(f"runs/{name}" for name in os.listdir(tmp_path / "runs"))  # what `compare runs/*` gives
    assert globbed == ["runs/base", "runs/compare", "runs/lag2", "runs/plots"]
    assert main(["compare", *globbed, "--out", "again"]) == 0
    captured = capsys.readouterr()
    assert set(table_rows(captured.out)) == {"header", "base", "lag2"}
    assert "compare: left out runs/compare (another command's outputs, not a run)" in captured.err
    assert "compare: left out runs/plots" in captured.err
    assert main(["plot", *globbed, "--out", "figs"]) == 0 and (tmp_path / "figs" / "learning_curve_combined.png").is_file()
    assert main(["compare", "runs/compare"]) == 2  # on its own: not a run directory
    assert main(["compare", *globbed, "--labels", "a", "b", "c", "d"]) == 2  # --labels counts what is given


def test_plot_labels_leave_the_runs_own_pngs(two_runs, tmp_path, capsys):
    base, lag2 = two_runs
    before = {p.name: p.stat().st_mtime_ns for p in base.glob("*.png")}
    assert "learning_curve.png" in before  # the run drew its own (plots = True)
    out = tmp_path / "figs"
    assert main(["plot", str(base), str(lag2), "--labels", "sync", "lagged", "--out", str(out)]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in base.glob("*.png")} == before  # not rewritten
    assert (out / "sync" / "learning_curve.png").stat().st_size > 0 and (out / "learning_curve_combined.png").is_file()


def test_compare_user_errors_exit_2_with_one_line(two_runs, tmp_path, capsys):
    base, lag2 = two_runs
    (tmp_path / "empty").mkdir()
    cases = [
        (["compare", str(base), str(lag2), "--labels", "only-one"], "--labels: got 1 label(s)"),
        (["compare", str(base), "--labels", "a", "b"], "for 1 run dir(s)"),
        (["compare", str(base), str(lag2), "--labels", "same", "same"], "repeated labels"),
        (["compare", str(base), str(tmp_path / "nope")], "does not exist"),
        (["compare", str(base), str(tmp_path / "empty")], "no metrics.jsonl"),
        (["compare"], "at least one RUN_DIR"),
        (["compare", str(base), "--threshold", "high"], "--threshold"),
        (["compare", str(base), "--bogus"], "unknown option"),
        (["plot", str(base), str(lag2), "--labels", "x"], "--labels: got 1 label(s)"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error:") and err.count("\n") == 1 and needle in err, (argv, err)
        assert "Traceback" not in err


def test_plot_labels_name_the_runs(two_runs, tmp_path, capsys, monkeypatch):
    base, lag2 = two_runs
    seen = []
    real = plots.learning_curve

    def spy(runs, *args, **kwargs):
        seen.append(list(runs))
        return real(runs, *args, **kwargs)

    monkeypatch.setattr(plots, "learning_curve", spy)  # the combined curve (cli/tools.py)
    monkeypatch.setattr(run_plots, "learning_curve", spy)  # each run's own (plots.plot_run)
    assert main(["plot", str(base), str(lag2), "--labels", "A", "B", "--out", str(tmp_path)]) == 0
    assert seen == [["A"], ["B"], ["A", "B"]]  # each run's own curve, then the combined one
    assert (tmp_path / "learning_curve_combined.png").is_file()
    assert "learning_curve_combined.png" in capsys.readouterr().out


def test_summary_text_format():
    table = pd.DataFrame({"num_seeds": [2], "final_return_mean": [123.456789], "lag_max": [NAN]},
                         index=pd.Index(["run-a"], name="run"))
    assert summary_text(table).splitlines()[2].split() == ["run-a", "2", "123.457", "nan"]


# ---------------------------------------------------------------------------- throughput smoothing


def test_rolling_mean_hand_values():
    np.testing.assert_allclose(plots.rolling_mean([1, 2, 3, 4, 5], 3), [1, 1.5, 2, 3, 4])
    np.testing.assert_allclose(plots.rolling_mean([10, NAN, 20, 30], 2), [10, 10, 20, 25])  # NaN skipped
    np.testing.assert_allclose(plots.rolling_mean([NAN, NAN, 4], 2), [NAN, NAN, 4])
    np.testing.assert_allclose(plots.rolling_mean([3, 1, 4], 1), [3, 1, 4])
    for bad in (0, 1.5, True, None):
        with pytest.raises(ValueError, match="window"):
            plots.rolling_mean([1.0], bad)


def sawtooth() -> pd.DataFrame:
    """4 iterations x 2 seeds (the same figures per iteration) with sawtooth rates."""
    rows = []
    for i, (total, per) in enumerate([(100, [10, 30]), (300, [30, 10]), (100, [10, 30]), (300, [30, 10])]):
        for seed in (0, 1):
            rows.append({"seed": seed, "iteration": i + 1, "wall_time": 0.5 * (i + 1), "steps_per_second": float(total),
                         "sampler_steps_per_second": per})
    return pd.DataFrame(rows)


def test_throughput_lines_are_rolling_means():
    fig = plots.throughput(sawtooth(), window=2)
    total, s0, s1 = fig.axes[0].lines
    np.testing.assert_allclose(total.get_xdata(), [0.5, 1.0, 1.5, 2.0])
    np.testing.assert_allclose(total.get_ydata(), [100, 200, 200, 200])
    np.testing.assert_allclose(s0.get_ydata(), [10, 20, 20, 20])
    np.testing.assert_allclose(s1.get_ydata(), [30, 20, 20, 20])
    assert "rolling mean over 2 iterations" in fig.axes[0].get_title()
    # default window (10 iterations > 4): the running mean from the first iteration
    assert plots.THROUGHPUT_WINDOW == 10
    np.testing.assert_allclose(plots.throughput(sawtooth()).axes[0].lines[0].get_ydata(), [100, 200, 500 / 3, 200])
    np.testing.assert_allclose(plots.throughput(sawtooth(), window=1).axes[0].lines[0].get_ydata(), [100, 300, 100, 300])
    with pytest.raises(ValueError, match="window"):
        plots.throughput(sawtooth(), window=0)


# ---------------------------------------------------------------------------- legends


def assert_legend_outside(fig) -> None:
    fig.canvas.draw()
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    legend = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert legend.x0 >= ax.get_window_extent().x1, "the legend overlaps the axes"


def test_legends_never_cover_the_axes(two_runs):
    base, lag2 = two_runs
    runs = {"base": pd.DataFrame(pa.read_jsonl(base / "metrics.jsonl")), "lag2": pd.DataFrame(pa.read_jsonl(lag2 / "metrics.jsonl"))}
    sweep_like = pd.DataFrame({"n": [1, 2, 4], "steps_per_second": [1.0, 2.0, 3.0], "approx_kl": [0.001, 0.01, 0.02]})
    figures = [
        plots.throughput(sawtooth()),
        plots.learning_curve(runs),
        plots.kl_over_time(runs["lag2"]),
        plots.kl_per_lag(runs["lag2"]),
        plots.kl_over_time_runs(runs),
        plots.lag_histograms(runs),
        plots.sweep_throughput_kl(sweep_like, x="n"),
    ]
    for fig in figures:
        assert_legend_outside(fig)


def test_overlay_plots_data(two_runs):
    base, lag2 = two_runs
    runs = {"base": pd.DataFrame(pa.read_jsonl(base / "metrics.jsonl")), "lag2": pd.DataFrame(pa.read_jsonl(lag2 / "metrics.jsonl"))}
    lines = plots.lag_histograms(runs).axes[0].lines
    np.testing.assert_allclose(lines[0].get_ydata(), [1.0])  # sync: every sample at lag 0
    lag2_hist = pa.lag_histogram_of(runs["lag2"])
    np.testing.assert_allclose(lines[1].get_ydata(), lag2_hist / lag2_hist.sum())
    kl_lines = plots.kl_over_time_runs(runs).axes[0].lines
    assert [line.get_label() for line in kl_lines[:2]] == ["base", "lag2"]
    np.testing.assert_allclose(kl_lines[1].get_ydata(), pd.to_numeric(runs["lag2"]["approx_kl"]))
