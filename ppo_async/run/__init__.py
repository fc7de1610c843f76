"""Layer 6, `run/`: the run shell around every mode.

`recorder` (the one writer of a run: rows, TensorBoard, W&B, checkpoints, figures),
`rundir` (what a run directory holds and whether a run may start or resume there),
`checkpoint` (orbax), `result` (`TrainResult`) and `policy` (a trained policy that acts and
is evaluated). May import every layer below: `errors`, `envs`, `config`, `core`, `runtime`,
`report`. Never `modes`, `study` or `cli`.
"""
