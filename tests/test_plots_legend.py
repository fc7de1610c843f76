"""A legend never takes width from the axes (issue 27 item 7): it sits outside them, on the
right, and the figure grows by its width instead of the axes shrinking."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ppo_async.report import figures, plots


def axes_width_in(fig, ax) -> float:
    fig.canvas.draw()
    return ax.get_window_extent().width / fig.dpi


def lines_figure(labels):
    """The same two lines (the same ticks) in each figure; only their labels differ."""
    fig, ax = figures.figure()
    for i, label in enumerate(labels):
        ax.plot(np.arange(10), np.arange(10) * (i + 1), label=label)
    return fig, ax


def test_the_axes_are_as_wide_with_a_long_legend_as_without_one():
    bare, bare_ax = lines_figure([None, None])
    figures.legend_outside(bare, bare_ax)
    assert not bare.legends  # nothing labelled: no legend
    short, short_ax = lines_figure(["a", "b"])
    figures.legend_outside(short, short_ax)
    long, long_ax = lines_figure(["a run with a very long label " * 3, "another " * 8])
    figures.legend_outside(long, long_ax)
    width = axes_width_in(bare, bare_ax)
    assert axes_width_in(short, short_ax) == pytest.approx(width, abs=0.02)
    assert axes_width_in(long, long_ax) == pytest.approx(width, abs=0.02)
    assert long.get_figwidth() > short.get_figwidth() > bare.get_figwidth()  # the figure grew instead
    legend_box = long.legends[0].get_window_extent()
    assert legend_box.x0 >= long_ax.get_window_extent().x1  # outside the axes: it covers no data
    assert legend_box.x1 <= long.get_figwidth() * long.dpi + 1  # and inside the figure


def test_a_plot_with_long_run_labels_keeps_its_axes_width(tmp_path):
    frame = pd.DataFrame({"env_steps": np.arange(1, 11) * 100, "seed": 0, "episode_return": np.linspace(0, 9, 10),
                          "approx_kl": np.full(10, 0.005)})
    short = plots.kl_over_time_runs({"a": frame}, path=tmp_path / "short.png")
    long = plots.kl_over_time_runs({"a very long run label that would squeeze the axes " * 2: frame},
                                   path=tmp_path / "long.png")
    assert axes_width_in(long, long.axes[0]) == pytest.approx(axes_width_in(short, short.axes[0]), abs=0.02)
    assert long.get_figwidth() > short.get_figwidth()
