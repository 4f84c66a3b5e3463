"""raystream.tune: Ray Tune sweeps from Hydra sweep files, one MLflow parent run per sweep.

    raystream.tune.sweep.run_sweep(cfg, overrides, fit=None) -> SweepOutcome
`raystream sweep <overrides>` (default sweep=smoke) runs it and prints its summary and exit code (raystream/cli.py).
The report a sweep prints (`raystream report`) only reads MLflow: raystream/study/report.py.

Files: config.py (the `sweep` group's dataclass and checks), space.py (sweep file -> grid cells of checked
configs), searcher.py (grid x Optuna), sweep.py (plan -> lock -> parent run -> Tuner -> outcomes; resume),
trial.py (one trial: its config, its Train run, its failure recorded), lock.py (one sweep of a name at a time),
release.py (gives a stopped trial's Train workers back), console.py (the sweep's progress lines). The parent
run's MLflow bookkeeping is raystream/tracking/parent.py.
Importing this package starts no Ray.
"""
