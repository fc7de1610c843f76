"""Layer 3, `core/`: the pure maths of PPO under lag, jittable and free of threads and I/O.

`types` (transitions, trajectories, train state), `normalization` (running observation
statistics), `losses` (PPO clip, dual-clip, decoupled PPO, V-trace, value losses),
`networks` (actor-critic and its distributions), `rollout` (the jitted vmapped rollout) and
`host_rollout` (the same `Trajectory` from a host-side simulator), `learner` (the PPO update
and its diagnostics), `lag` (lag schedules) and `kl_control` (the KL-to-behaviour
controller's decision rule). May import: `errors`, `envs`, `config`. Never `runtime` or above.
"""
