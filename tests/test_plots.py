"""plots: valid PNGs, the plotted numbers are the right ones, clear errors for missing columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from ppo_async.report import figures, plots, run_readers
from ppo_async.report.metrics import JsonlWriter

NAN = float("nan")


def assert_png(path) -> None:
    assert os.path.getsize(path) > 0
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.verify()
    with Image.open(path) as im:
        assert im.size[0] > 100 and im.size[1] > 100


def seed_rows(seed: int, returns: list, steps=(100, 200, 300, 400), **extra) -> list[dict]:
    rows = []
    for i, (s, r) in enumerate(zip(steps, returns)):
        row = {
            "seed": seed,
            "iteration": i,
            "env_steps": s,
            "wall_time": 0.5 * (i + 1),
            "steps_per_second": 1000.0 * (i + 1),
            "episode_return": r,
            "approx_kl": 0.001 * (i + 1) * (seed + 1),
            "approx_kl_max": 0.004 * (i + 1) * (seed + 1),
            "clip_fraction": 0.1,
        }
        row.update({k: v[i] for k, v in extra.items()})
        rows.append(row)
    return rows


def three_seeds() -> pd.DataFrame:
    # Seed 1 has no finished episode at env step 200 (None): it is interpolated from its
    # neighbours (100 -> 0, 300 -> 40) to 20.
    rows = seed_rows(0, [1.0, 2.0, 3.0, 4.0]) + seed_rows(1, [0.0, None, 40.0, 50.0]) + seed_rows(2, [10.0, 30.0, NAN, 10.0])
    return pd.DataFrame(rows)


def test_import_does_not_touch_matplotlib():
    code = "import sys, ppo_async.report.plots; assert 'matplotlib' not in sys.modules, 'imported matplotlib'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_learning_curve_median_band_and_png(tmp_path):
    df = three_seeds()
    other = pd.DataFrame(seed_rows(0, [5.0, 6.0, 7.0, 8.0]))
    path = tmp_path / "sub" / "lc.png"
    fig = plots.learning_curve({"async": df, "sync": other}, x="env_steps", path=path)
    assert_png(path)
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [100, 200, 300, 400])
    # Per step: seed values (seed 2 at 300 interpolated between 30 and 10 -> 20).
    per_step = np.array([[1.0, 0.0, 10.0], [2.0, 20.0, 30.0], [3.0, 40.0, 20.0], [4.0, 50.0, 10.0]])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.median(per_step, axis=1))
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [5.0, 6.0, 7.0, 8.0])
    # The 25-75% band of the first run.
    band = ax.collections[0].get_paths()[0].vertices
    q25, q75 = np.percentile(per_step, [25, 75], axis=1)
    for xv, lo, hi in zip([100, 200, 300, 400], q25, q75):
        ys = band[np.isclose(band[:, 0], xv), 1]
        assert np.isclose(ys.min(), lo) and np.isclose(ys.max(), hi)
    labels = [line.get_label() for line in ax.lines]
    assert labels[0].startswith("async") and "3 seeds" in labels[0] and labels[1].startswith("sync")


def test_learning_curve_common_grid_and_wall_time():
    # Seeds logged at different env steps: the grid is the union restricted to the overlap.
    a = seed_rows(0, [0.0, 10.0, 20.0], steps=(0, 100, 200))
    b = seed_rows(1, [5.0, 15.0, 25.0], steps=(50, 150, 250))
    fig = plots.learning_curve(pd.DataFrame(a + b), x="env_steps")
    line = fig.axes[0].lines[0]
    np.testing.assert_array_equal(line.get_xdata(), [50, 100, 150, 200])
    # seed 0: 5, 10, 15, 20; seed 1: 5, 10, 15, 20 (interpolated) -> median identical.
    np.testing.assert_allclose(line.get_ydata(), [5.0, 10.0, 15.0, 20.0])
    fig = plots.learning_curve(pd.DataFrame(a), x="wall_time")
    np.testing.assert_allclose(fig.axes[0].lines[0].get_xdata(), [0.5, 1.0, 1.5])
    assert fig.axes[0].get_xlabel() == "wall time (s)"


def test_learning_curve_errors_and_empty():
    df = three_seeds()
    with pytest.raises(ValueError, match=r"run 'x'.*\['episode_return'\]"):
        plots.learning_curve({"x": df.drop(columns="episode_return")})
    with pytest.raises(ValueError, match="at least one run"):
        plots.learning_curve({})
    empty = df.assign(episode_return=None)
    fig = plots.learning_curve({"x": empty})  # no finished episode yet: a figure, no line
    assert len(fig.axes[0].lines) == 0 and "no finite" in fig.axes[0].texts[0].get_text()


def test_kl_over_time_lines_and_guides(tmp_path):
    df = three_seeds()
    fig = plots.kl_over_time(df, path=tmp_path / "kl.png")
    assert_png(tmp_path / "kl.png")
    lines = fig.axes[0].lines
    assert len(lines) == 4
    # Mean over the 3 seeds: 0.001 * (i+1) * mean(1, 2, 3) = 0.002 * (i+1).
    np.testing.assert_array_equal(lines[0].get_xdata(), [100, 200, 300, 400])
    np.testing.assert_allclose(lines[0].get_ydata(), [0.002, 0.004, 0.006, 0.008])
    np.testing.assert_allclose(lines[1].get_ydata(), [0.008, 0.016, 0.024, 0.032])
    assert lines[1].get_linestyle() == "--" and lines[0].get_linestyle() == "-"
    assert lines[2].get_ydata()[0] == 0.01 and "watch" in lines[2].get_label()
    assert lines[3].get_ydata()[0] == 0.03 and "lag hurting" in lines[3].get_label()
    # Without approx_kl_max: one data line plus the guides.
    fig = plots.kl_over_time(df.drop(columns="approx_kl_max"))
    assert len(fig.axes[0].lines) == 3
    with pytest.raises(ValueError, match="approx_kl"):
        plots.kl_over_time(df.drop(columns="approx_kl"))


def lag_frame() -> pd.DataFrame:
    hist = [[5, 3, 0, 1], [2, 2, 2, 2], None, [1, 0, 0, 0]]
    kl = [[0.001, 0.01, None, 0.05], [0.003, 0.02, 0.03, 0.07], None, [0.002, None, None, None]]
    rows = seed_rows(0, [1.0, 2.0, 3.0, 4.0], lag_histogram=hist, kl_per_lag=kl, lag_mean=[0.7, 1.5, None, 0.0], sampler_steps_per_second=[[10, 20], [11, 21], [12, None], [13, 23]])
    return pd.DataFrame(rows)


def test_lag_histogram_bar_heights(tmp_path):
    fig = plots.lag_histogram(lag_frame(), path=tmp_path / "lag.png")
    assert_png(tmp_path / "lag.png")
    patches = fig.axes[0].patches
    assert [p.get_height() for p in patches] == [8, 5, 2, 3]
    np.testing.assert_allclose([p.get_x() + p.get_width() / 2 for p in patches], [0, 1, 2, 3])
    assert "18 samples" in fig.axes[0].get_title()
    # the last bucket holds every larger lag
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "1", "2", "\u22653"]
    with pytest.raises(ValueError, match=r"lag_histogram.*\['lag_histogram'\].*columns present"):
        plots.lag_histogram(pd.DataFrame(seed_rows(0, [1.0] * 4)))
    with pytest.raises(ValueError, match="no list-valued rows"):
        plots.lag_histogram(pd.DataFrame({"lag_histogram": [None, None]}))


def test_kl_per_lag_ignores_none(tmp_path):
    fig = plots.kl_per_lag(lag_frame(), path=tmp_path / "klag.png")
    assert_png(tmp_path / "klag.png")
    patches = fig.axes[0].patches
    np.testing.assert_allclose([p.get_height() for p in patches], [0.002, 0.015, 0.03, 0.06])
    # A lag bucket no row had a sample in gets no bar.
    df = pd.DataFrame({"kl_per_lag": [[0.01, None, 0.02], [0.03, None, None]]})
    fig = plots.kl_per_lag(df)
    patches = fig.axes[0].patches
    np.testing.assert_allclose([p.get_x() + p.get_width() / 2 for p in patches], [0, 2])
    np.testing.assert_allclose([p.get_height() for p in patches], [0.02, 0.02])
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert any("watch" in s for s in labels) and any("lag hurting" in s for s in labels)
    with pytest.raises(ValueError, match="kl_per_lag"):
        plots.kl_per_lag(three_seeds())


def test_throughput_total_and_per_sampler(tmp_path):
    # window=1: the raw per-iteration rates (the default smooths; see tests/test_compare.py)
    fig = plots.throughput(three_seeds(), path=tmp_path / "tp.png", window=1)
    assert_png(tmp_path / "tp.png")
    lines = fig.axes[0].lines
    assert len(lines) == 1  # one point per iteration, not per seed
    np.testing.assert_allclose(lines[0].get_xdata(), [0.5, 1.0, 1.5, 2.0])
    np.testing.assert_allclose(lines[0].get_ydata(), [1000, 2000, 3000, 4000])
    fig = plots.throughput(lag_frame(), window=1)
    lines = fig.axes[0].lines
    assert [line.get_label() for line in lines] == ["total (all seeds)", "sampler 0", "sampler 1"]
    np.testing.assert_allclose(lines[1].get_ydata(), [10, 11, 12, 13])
    np.testing.assert_allclose(lines[2].get_ydata(), [20, 21, NAN, 23])
    with pytest.raises(ValueError, match="steps_per_second"):
        plots.throughput(three_seeds().drop(columns="steps_per_second"))


def test_sampler_time_split_stacks_the_last_rows_seconds(tmp_path):
    df = pd.DataFrame(
        {
            "sampler_rollout_s": [[1.0, 1.0], [2.0, 1.5]],
            "sampler_wait_params_s": [[0.0, 0.0], [0.5, 0.0]],
            "sampler_wait_buffer_s": [[0.0, 0.0], [0.25, None]],
            "sampler_latency_s": [[0.0, 3.0], [1.0, 6.0]],
        }
    )
    fig = plots.sampler_time_split(df, path=tmp_path / "st.png")
    assert_png(tmp_path / "st.png")
    bars = fig.axes[0].containers
    assert [c.get_label() for c in bars] == ["rollout", "waiting for params", "buffer put (space, lock, write)", "simulated env latency"]
    np.testing.assert_allclose([r.get_width() for r in bars[0]], [2.0, 1.5])
    np.testing.assert_allclose([r.get_x() for r in bars[3]], [2.75, 1.5])  # stacked after the earlier segments
    np.testing.assert_allclose([r.get_width() for r in bars[3]], [1.0, 6.0])
    with pytest.raises(ValueError, match="sampler_latency_s"):
        plots.sampler_time_split(df.drop(columns="sampler_latency_s"))


def test_sweep_throughput_kl_twin_axes(tmp_path):
    rows = []
    for n, (sps, kl) in {1: (100.0, 0.001), 2: (180.0, 0.004), 4: (300.0, 0.012), 8: (400.0, 0.04)}.items():
        for rep in range(3):  # three rows per value: the plot shows their mean
            rows.append({"num_samplers": n, "steps_per_second": sps + (rep - 1) * 10, "approx_kl": kl * (1 + 0.1 * (rep - 1))})
    df = pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # order must not matter
    fig = plots.sweep_throughput_kl(df, x="num_samplers", path=tmp_path / "sweep.png")
    assert_png(tmp_path / "sweep.png")
    assert len(fig.axes) == 2
    sps_line, kl_line = fig.axes[0].lines[0], fig.axes[1].lines[0]
    np.testing.assert_allclose(sps_line.get_xdata(), [1, 2, 4, 8])
    np.testing.assert_allclose(sps_line.get_ydata(), [100, 180, 300, 400])
    np.testing.assert_allclose(kl_line.get_ydata(), [0.001, 0.004, 0.012, 0.04])
    assert fig.axes[0].get_xlabel() == "num_samplers"
    # Categorical x keeps first-appearance order.
    cat = pd.DataFrame({"mode": ["sync", "threaded", "sync"], "steps_per_second": [1.0, 5.0, 3.0], "approx_kl": [0.0, 0.02, 0.0]})
    fig = plots.sweep_throughput_kl(cat, x="mode")
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [2.0, 5.0])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["sync", "threaded"]
    with pytest.raises(ValueError, match=r"\['max_lag'\]"):
        plots.sweep_throughput_kl(df, x="max_lag")


def write_run(run_dir, rows) -> None:
    with JsonlWriter(os.path.join(run_dir, "metrics.jsonl")) as w:
        for row in rows:
            w.write({k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()})


def test_plot_run_sync_and_lag_runs(tmp_path):
    sync_dir = tmp_path / "sync"
    write_run(sync_dir, three_seeds().to_dict("records"))
    paths = plots.plot_run(str(sync_dir))
    assert [os.path.basename(p) for p in paths] == ["learning_curve.png", "kl_over_time.png", "throughput.png"]
    for p in paths:
        assert os.path.dirname(p) == str(sync_dir)
        assert_png(p)

    lag_dir = tmp_path / "lagged"
    write_run(lag_dir, lag_frame().to_dict("records"))
    with open(lag_dir / "metrics.jsonl", "a") as f:
        f.write('{"seed": 0, "iterat')  # a torn last line from a killed run is ignored
    paths = plots.plot_run(lag_dir)
    assert [os.path.basename(p) for p in paths] == ["learning_curve.png", "kl_over_time.png", "throughput.png", "lag_histogram.png", "kl_per_lag.png"]
    for p in paths:
        assert_png(p)

    # No finished episode yet: the learning curve is skipped, the rest is written.
    early = tmp_path / "early"
    rows = three_seeds().assign(episode_return=None).to_dict("records")
    write_run(early, rows)
    assert [os.path.basename(p) for p in plots.plot_run(early)] == ["kl_over_time.png", "throughput.png"]
    with open(early / "metrics.jsonl") as f:
        assert json.loads(f.readline())["episode_return"] is None

    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plots.plot_run(tmp_path / "nowhere")


def test_run_frames_reduce_the_lists_to_what_every_row_would_draw(tmp_path):
    """`plot_run` reads a run once and keeps no row's lists: the one-row `lists` frame gives
    the histogram, KL per lag and sampler split of all rows, the curves keep every row."""
    rows = [
        {"seed": 0, "iteration": 1, "env_steps": 32, "approx_kl": 0.01, "lag_histogram": [32, 0],
         "kl_per_lag": [0.01, None], "sampler_rollout_s": [1.0, 2.0]},
        {"seed": 0, "iteration": 2, "env_steps": 64, "approx_kl": 0.02, "lag_histogram": [10, 20, 2],
         "kl_per_lag": [0.03, 0.05, None], "sampler_rollout_s": [1.5, 2.5]},
        {"seed": 0, "iteration": 3, "env_steps": 96, "episode_return": -5.0},  # no lists (e.g. a sync row)
        {"seed": 0, "iteration": 4, "env_steps": 128, "approx_kl": 0.04, "lag_histogram": [0, 30, 2],
         "kl_per_lag": [None, 0.02, 0.07], "sampler_rollout_s": [2.0, 3.0]},
    ]
    for name in ("sampler_wait_params_s", "sampler_wait_buffer_s", "sampler_latency_s"):
        for r in rows:
            if "sampler_rollout_s" in r:
                r[name] = [0.5, 0.25]
    write_run(tmp_path, rows)
    curves, lists = plots.run_frames(tmp_path)
    full = plots.read_run_metrics(tmp_path)
    assert len(lists) == 1 and len(curves) == 4
    np.testing.assert_array_equal(plots.summed_lag_histogram(lists), [42, 50, 4])  # by hand
    np.testing.assert_array_equal(plots.summed_lag_histogram(lists), plots.summed_lag_histogram(full))
    np.testing.assert_allclose(plots.mean_kl_per_lag(lists), [0.02, 0.035, 0.07], rtol=1e-12)  # by hand
    np.testing.assert_allclose(plots.mean_kl_per_lag(lists), plots.mean_kl_per_lag(full), rtol=1e-12)
    assert lists["sampler_rollout_s"][0] == [2.0, 3.0]  # the last row's cumulative seconds
    assert curves["iteration"].tolist() == [1, 2, 3, 4]
    np.testing.assert_array_equal(figures.numeric(curves["approx_kl"]), [0.01, 0.02, NAN, 0.04])
    np.testing.assert_array_equal(figures.numeric(curves["episode_return"]), [NAN, NAN, -5.0, NAN])
    assert "lag_histogram" not in curves.columns
    paths = plots.plot_run(tmp_path)
    assert [os.path.basename(p) for p in paths] == ["learning_curve.png", "kl_over_time.png", "lag_histogram.png",
                                                    "kl_per_lag.png", "sampler_time.png"]
    with pytest.raises(ValueError, match="no rows"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "metrics.jsonl").write_text("")
        plots.run_frames(tmp_path / "empty")


def test_run_frames_bin_long_runs_to_a_bounded_number_of_points(tmp_path, monkeypatch):
    """Beyond MAX_CURVE_POINTS rows the curves are binned per seed (the end of a long run's
    plots holds a bounded number of points), each bin folded by the metric rules as a
    `log_every` row is: its position is its last row's, approx_kl its mean, approx_kl_max its
    maximum, episode_return weighted by the episodes each row finished, steps_per_second the
    harmonic mean, sampler_steps_per_second the last row's."""
    rows = []
    for i in range(1, 12):  # 11 iterations x 2 seeds, interleaved as a multi-seed run writes them
        for seed in (0, 1):
            rows.append({"seed": seed, "iteration": i, "env_steps": 32 * i, "wall_time": 0.1 * i,
                         "approx_kl": 0.01 * i * (seed + 1), "approx_kl_max": 0.02 * i * (seed + 1),
                         "episode_return": None if i % 2 else -float(i * (seed + 1)), "episodes_finished": 0 if i % 2 else 1,
                         "steps_per_second": 100.0 * i,
                         "sampler_steps_per_second": [float(i), None if i == 2 else 2.0 * i], "lag_histogram": [i, 1]})
    write_run(tmp_path, rows)
    monkeypatch.setattr(run_readers, "MAX_CURVE_POINTS", 4)  # 22 rows -> 6 rows per point; the last bin holds 5
    curves, lists = plots.run_frames(tmp_path)
    assert curves.attrs["rows_per_point"] == 6
    assert len(curves) == 4 <= run_readers.MAX_CURVE_POINTS + 2  # a seed's unfinished bin comes last
    assert curves["seed"].tolist() == [0, 1, 0, 1]
    assert curves["iteration"].tolist() == [6, 6, 11, 11] and curves["env_steps"].tolist() == [192, 192, 352, 352]
    np.testing.assert_allclose(curves["approx_kl"], [0.035, 0.07, 0.09, 0.18])  # means of 1..6 and 7..11, x 0.01 (x 2)
    np.testing.assert_allclose(curves["approx_kl_max"], [0.12, 0.24, 0.22, 0.44])  # maxima
    np.testing.assert_allclose(curves["episode_return"], [-4.0, -8.0, -9.0, -18.0])  # the even iterations' returns
    np.testing.assert_allclose(curves["episodes_finished"], [3, 3, 2, 2])  # summed
    harmonic = [6 / sum(1 / (100.0 * i) for i in range(1, 7)), 5 / sum(1 / (100.0 * i) for i in range(7, 12))]
    np.testing.assert_allclose(curves["steps_per_second"], [harmonic[0], harmonic[0], harmonic[1], harmonic[1]])
    assert curves["sampler_steps_per_second"][0] == [6.0, 12.0]  # the bin's last row's
    np.testing.assert_array_equal(plots.summed_lag_histogram(lists), [132, 22])  # the lists still see every row
    full = plots.read_run_metrics(tmp_path)  # the same reduction by hand from every row
    for seed, (lo, hi) in [(0, (1, 6)), (1, (7, 11))]:
        part = full[(full["seed"] == seed) & full["iteration"].between(lo, hi)]
        row = curves[(curves["seed"] == seed) & (curves["iteration"] == hi)].iloc[0]
        assert row["approx_kl"] == pytest.approx(part["approx_kl"].mean())
        assert row["approx_kl_max"] == pytest.approx(part["approx_kl_max"].max())

    paths = plots.plot_run(tmp_path)
    assert [os.path.basename(p) for p in paths] == ["learning_curve.png", "kl_over_time.png", "throughput.png",
                                                    "lag_histogram.png"]
    for p in paths:
        assert_png(p)
    fig = plots.throughput(curves)
    assert "6 rows per point" in fig.axes[0].get_title()
    np.testing.assert_allclose(fig.axes[0].lines[0].get_xdata(), [0.6, 1.1])  # one point per bin, seeds averaged

    monkeypatch.setattr(run_readers, "MAX_CURVE_POINTS", 22)  # up to the limit: one point per row, as before
    curves, _ = plots.run_frames(tmp_path)
    assert curves.attrs["rows_per_point"] == 1 and len(curves) == 22
    assert curves["iteration"].tolist() == [r["iteration"] for r in rows]
    assert "rows per point" not in plots.throughput(curves).axes[0].get_title()


def _same(a, b) -> bool:
    """Equal metric values, None and NaN alike (a DataFrame holds a missing number as NaN)."""
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    missing = [v is None or (isinstance(v, float) and np.isnan(v)) for v in (a, b)]
    return missing[0] == missing[1] and (missing[0] or a == b)


def test_a_binned_curve_equals_aggregate_rows_on_the_same_rows(tmp_path, monkeypatch):
    """One table of metric rules (`aggregate.FIELD_RULES`): each curve point of a binned run
    is `aggregate_rows` of its bin's rows (what a run with `log_every` = rows per point would
    have logged), for a field of every rule: last (iteration, env_steps, wall_time,
    sampler_steps_per_second), mean (approx_kl), max (approx_kl_max), sum (episodes_finished),
    episodes (episode_return, with bins where no episode finished at all and rows of a bin
    with none), harmonic (steps_per_second, a None among them)."""
    from ppo_async.report.aggregate import FIELD_RULES, aggregate_rows
    from ppo_async.report.metrics import read_jsonl

    rng = np.random.default_rng(0)
    rows = []
    for i in range(1, 24):  # 23 iterations x 2 seeds; seed 1 finishes no episode in iterations 7-12 (a whole bin)
        for seed in (0, 1):
            finished = 0 if (seed == 1 and 7 <= i <= 12) or rng.random() < 0.4 else int(rng.integers(1, 5))
            rows.append({"seed": seed, "iteration": i, "env_steps": 64 * i, "wall_time": 0.05 * i + 0.01 * seed,
                         "approx_kl": float(rng.uniform(0, 0.02)), "approx_kl_max": float(rng.uniform(0.02, 0.05)),
                         "episodes_finished": finished, "episode_return": float(rng.normal(-300, 50)) if finished else None,
                         "steps_per_second": None if i == 9 else float(rng.uniform(1e3, 5e3)),
                         "sampler_steps_per_second": [float(rng.uniform(500, 900)), float(rng.uniform(500, 900))]})
    write_run(tmp_path, rows)
    monkeypatch.setattr(run_readers, "MAX_CURVE_POINTS", 8)  # 46 rows -> 6 rows per point; each seed's last bin holds 5
    curves, _ = plots.run_frames(tmp_path)
    assert curves.attrs["rows_per_point"] == 6 and len(curves) == 8
    written = read_jsonl(tmp_path / "metrics.jsonl")
    columns = ("iteration", "env_steps", "wall_time", "approx_kl", "approx_kl_max", "episodes_finished",
               "episode_return", "steps_per_second", "sampler_steps_per_second")
    assert {FIELD_RULES.get(c) for c in columns} == {"last", None, "max", "sum", "episodes", "harmonic"}
    points = curves.to_dict("records")
    for seed in (0, 1):
        mine = [r for r in written if r["seed"] == seed]
        bins = [mine[k:k + 6] for k in range(0, len(mine), 6)]
        expected = [aggregate_rows(b) for b in bins]
        got = [p for p in points if p["seed"] == seed]
        assert len(got) == len(expected) == 4
        for point, want in zip(got, expected):
            for name in columns:
                assert _same(point[name], want[name]), (seed, point["iteration"], name, point[name], want[name])
    no_episodes = [p for p in points if p["seed"] == 1 and p["iteration"] == 12][0]
    assert np.isnan(no_episodes["episode_return"]) and no_episodes["episodes_finished"] == 0
