"""Layer 8, `study/`: experiments built from many runs.

`sweep` (many configs and seeds in one compile), `tune` (the staged recipe that picks a
setting), `benchmarking` (side-by-side timing helpers for the benchmark scripts). May import
every layer below. Never `cli`.
"""
