"""raystream.tune: Ray Tune sweeps from Hydra sweep files, one MLflow parent run per sweep, and the report.

    raystream.tune.sweep.main(cfg, overrides) -> int     # `raystream sweep <overrides>` (default sweep=smoke)
    raystream.tune.sweep.run_sweep(cfg, overrides, fit=...) -> SweepOutcome
    raystream.tune.report.main(experiment=None, parent=None, out=None) -> int   # `raystream report`

Files: config.py (the `sweep` group's dataclass and checks), space.py (sweep file -> grid cells of checked
configs), searcher.py (grid x Optuna), sweep.py (Tuner, trials, MLflow parent run, resume), release.py (gives a
stopped trial's Train workers back), report.py (table, CSV, plots from MLflow).
Importing this package starts no Ray.
"""
