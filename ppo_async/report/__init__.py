"""Layer 5, `report/`: what a run's numbers mean and how they are shown.

`metrics` (rows, JSONL, the console), `aggregate` (the one table of metric rules: how each
field folds over iterations, used by `log_every` rows and by the plots' binned curves alike),
`health` (the warnings a row raises), `analysis` (DataFrames: summaries, lag histograms,
per-sampler tables) and `plots` (figures; matplotlib is imported lazily). May import:
`errors`, `envs`, `config`, `core`, `runtime`. Never `run`, `modes`, `study` or `cli`.
"""
