"""A sweep's progress (issue 27 item 6): one line per finished config with `configs k/K` and
an ETA, not an unlabelled bar per compiled group."""

from __future__ import annotations

import ppo_async as pa
from ppo_async.study.sweep import GridProgress


def test_grid_progress_counts_configs_and_estimates_the_rest():
    tracker = GridProgress(num_configs=4, num_groups=2, enabled=False)
    tracker.group = 1
    tracker.started -= 10.0  # 10 s so far
    line = tracker.line(1, "config 0: ppo.clip_eps=0.1")
    assert line.startswith("sweep: configs 1/4 done (config 0: ppo.clip_eps=0.1; group 1/2), 10s elapsed, ETA 30s")
    assert "configs 3/4" in tracker.line(2, "configs 1, 2 in one vmapped program")


def test_a_sweep_prints_one_line_per_config_and_no_bar(capsys):
    base = pa.Config(env="CartPole-v1", total_env_steps=256,
                     rollout=pa.RolloutConfig(num_envs=4, num_steps=32), ppo=pa.PPOConfig(num_minibatches=2, num_epochs=1))
    pa.sweep(base, {"ppo.clip_eps": [0.1, 0.2]}, seeds=1, strategy="loop")
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("sweep: ")]
    assert [line.split(" done")[0] for line in lines] == ["sweep: configs 1/2", "sweep: configs 2/2"], out
    assert "ETA" in lines[0] and "\r" not in out + err
