"""Layer 4, `runtime/`: threads, devices and processes.

`buffer` (the device-side ring of fresh trajectories), `param_store` (versioned parameter
snapshots for samplers), `placement` (where the learner's state and batches live: one device,
data-parallel over local devices, or over several processes), `distributed`
(jax.distributed, heartbeats, the cross-process exchange), `launch` (local processes) and
`xla_flags` (set at entry points only). May import: `errors`, `envs`, `config`, `core`.
Never `report`, `run`, `modes`, `study` or `cli`.
"""
