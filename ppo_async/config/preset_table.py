"""The per-env presets as data, and the defaults an env brings (`env_defaults`).

Brax and MuJoCo Playground ship per-env PPO settings; so do we. A preset is a mapping of
dotted config fields to values, looked up by exact env name first, then by family prefix
(`"brax/"`, `"playground/"`, `"gymnasium/"`); the exact entry overrides the family's. A
host-side env (gymnasium/*, envpool/*) also brings `mode = "threaded"`, its one valid mode.
Imports nothing of the config package: `Config` applies these itself when it is built
(`ppo_async.config.explicit.apply_env_defaults`).
"""

from __future__ import annotations

from typing import Any

from ppo_async.envs.registry import HOST_ENV_FAMILIES, split_env_name

# Long-horizon continuous control: 1000-step episodes, rewards of ~1 per step.
_PHYSICS = {
    "ppo.gamma": 0.99,
    "ppo.gae_lambda": 0.95,
    "ppo.num_epochs": 4,
    "ppo.num_minibatches": 8,
    "ppo.learning_rate": 1e-3,
    "rollout.num_envs": 64,
    "rollout.num_steps": 32,
}

ENV_PRESETS: dict[str, dict[str, Any]] = {
    "brax/": dict(_PHYSICS),
    "playground/": {**_PHYSICS, "ppo.gamma": 0.995},
    # MuJoCo on host threads at the reference implementations' setting (CleanRL's
    # ppo_continuous_action, SB3's VecNormalize): a 2,048-step learner batch (one 16 x 128
    # chunk), 10 epochs x 32 minibatches of 64, rewards normalised by the running std of the
    # discounted return, value clipping at 0.2 (issue 26); an initial policy std of 0.61
    # (log-std -0.5 instead of CleanRL's 0: the ablation's largest factor, every HalfCheetah seed
    # on the fast gait). Its figures are the benchmark's: `python -m ppo_async benchmark --suite
    # mujoco` (experiments/results/benchmark; the preset with log-std 0 beside it in
    # experiments/results/benchmark_init_log_std_0, on the two-mode benchmark of the time,
    # experiments/results/benchmark_two_modes).
    "gymnasium/": {
        "ppo.gamma": 0.99,
        "ppo.num_epochs": 10,
        "ppo.num_minibatches": 32,
        "ppo.learning_rate": 3e-4,
        "ppo.value_clip_eps": 0.2,
        "network.init_log_std": -0.5,
        "rollout.num_envs": 16,
        "rollout.num_steps": 128,
        "rollout.normalize_reward": True,
        "rollout.reward_scale": 1.0,
        # The batch's moments merged before the SGD steps (Sample Factory's order): async Hopper
        # at 1M, 5 seeds, train 2,611 (worst 2,432) against 2,321 (worst 950) merged after SGD
        # (experiments/results/ablation, its +learner_norm+stats_before_sgd row; the after-SGD
        # figure from experiments/pending/benchmark's async Hopper runs; issue 39).
        "rollout.stats_update": "before_sgd",
    },
}
ENV_PRESETS["envpool/"] = ENV_PRESETS["gymnasium/"]  # the same MuJoCo tasks, stepped by EnvPool
# (A preset may set `num_samplers` for a family whose every mode has samplers, e.g. the host-side
# ones, threaded only: sync mode has one and refuses a count.)




def preset_for(env: str) -> dict[str, Any]:
    """The preset of `env` (dotted field -> value): its family's entry updated by its own."""
    family, sep, _ = env.partition("/")
    out: dict[str, Any] = {}
    if sep:
        out.update(ENV_PRESETS.get(f"{family}/", {}))
    out.update(ENV_PRESETS.get(env, {}))
    return out


def env_defaults(env: str) -> dict[str, Any]:
    """What `env` brings to every field the user did not set: `mode = "threaded"` for a host-side
    env (its simulator steps outside jit: the one mode it runs in), then its preset."""
    out: dict[str, Any] = {}
    try:
        if split_env_name(env)[0] in HOST_ENV_FAMILIES:
            out["mode"] = "threaded"
    except Exception:  # noqa: BLE001 - a malformed name: Config's own check reports it
        pass
    out.update(preset_for(env))
    return out
