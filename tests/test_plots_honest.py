"""Plots that do not mislead (issue 27 item 7): a run without lag gets no lag figures and no
"lag hurting" guide, a histogram that spans every possible lag labels its last bin exactly, a
single seed is called "1 seed"; `plot_run(out_dir=...)` leaves the run's own PNGs alone."""

from __future__ import annotations

import json
import os

import pandas as pd

from ppo_async.report import plots
from test_plots import lag_frame, seed_rows, write_run


def _tick_labels(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_xticklabels()]


def test_kl_plot_of_a_run_without_lag_draws_no_lag_guides():
    df = pd.DataFrame(seed_rows(0, [1.0, 2.0, 3.0, 4.0]))
    labels = [line.get_label() for line in plots.kl_over_time(df, lagged=False).axes[0].lines]
    assert not any("hurting" in label or "watch" in label for label in labels), labels
    labels = [line.get_label() for line in plots.kl_over_time(df).axes[0].lines]
    assert any("lag hurting" in label for label in labels)


def test_last_lag_bin_is_exact_unless_open_ended():
    assert _tick_labels(plots.lag_histogram(lag_frame(), open_ended=False)) == ["0", "1", "2", "3"]
    assert _tick_labels(plots.lag_histogram(lag_frame()))[-1] == "\u22653"
    assert _tick_labels(plots.kl_per_lag(lag_frame(), open_ended=False))[-1] == "3"


def test_one_seed_is_called_one_seed():
    fig = plots.learning_curve({"run": pd.DataFrame(seed_rows(0, [1.0, 2.0, 3.0, 4.0]))})
    assert fig.legends[0].get_texts()[0].get_text() == "run (1 seed)"
    assert "1 seed" in fig.axes[0].get_title() and "median" not in fig.axes[0].get_title()


def test_plot_run_of_a_sync_run_has_no_lag_figures_and_a_simulated_run_exact_bins(tmp_path):
    at_zero = [[4, 0, 0], [4, 0, 0], [4, 0, 0], [4, 0, 0]]
    sync_dir = tmp_path / "sync"
    write_run(sync_dir, seed_rows(0, [1.0, 2.0, 3.0, 4.0], lag_histogram=at_zero, kl_per_lag=[[0.01, None, None]] * 4))
    names = [os.path.basename(p) for p in plots.plot_run(sync_dir)]
    assert "lag_histogram.png" not in names and "kl_per_lag.png" not in names and "kl_over_time.png" in names

    lagged = tmp_path / "simulated"
    write_run(lagged, lag_frame().to_dict("records"))
    (lagged / "config.json").write_text(json.dumps({"mode": "simulated"}))
    out = tmp_path / "elsewhere"
    paths = plots.plot_run(lagged, out_dir=out)
    assert {os.path.dirname(p) for p in paths} == {str(out)} and not list(lagged.glob("*.png"))
    assert "lag_histogram.png" in [os.path.basename(p) for p in paths]
