"""raystream.tune: Ray Tune sweeps from Hydra sweep files, one MLflow parent run per sweep.

    raystream.tune.sweep.main(cfg, overrides) -> int     # `raystream sweep <overrides>` (default sweep=smoke)
    raystream.tune.sweep.run_sweep(cfg, overrides, fit=None) -> SweepOutcome
The report a sweep prints (`raystream report`) only reads MLflow: raystream/tracking/report.py.

Files: config.py (the `sweep` group's dataclass and checks), space.py (sweep file -> grid cells of checked
configs), searcher.py (grid x Optuna), sweep.py (Tuner, trials, MLflow parent run, resume), release.py (gives a
stopped trial's Train workers back).
Importing this package starts no Ray.
"""
