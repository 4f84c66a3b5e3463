"""raystream.train: one run (scenario x optimizer x stream) as a Ray Train V2 job, with checkpoints and MLflow.

    raystream.train.commands.main(cfg) -> int       # `raystream train <overrides>`
    raystream.train.run.fit(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None,
                            options=None)  # RunOptions: init_checked, step_hooks (a test's faults), register
        -> dict of final metrics ('loss', 'eval/*', 'steps_done', 'start_step', 'mlflow_run_id', 'run_name',
           'run_dir', 'checkpoint_path'); raises DivergedError (raystream/train/divergence.py) at the first
           non-finite loss or gradient, `run.Interrupted` (a KeyboardInterrupt) on Ctrl-C

Where things live: `commands.py` (`raystream train` as the terminal sees it), `resolved.py` (a run resolved once:
config, videos, run directory, MLflow ids), `run.py` (driver: the steps over that run: MLflow run, TorchTrainer,
the end), `run_end.py` (how its MLflow run ends), `inputs.py` (its videos as dataset-input rows), `lock.py` (the
directory lock of a run and of a sweep), `model_uri.py` (`models:/` starts fetched), `model_files.py` (a
LoggedModel's files), `loop.py` (the per-worker loop: setup, restore, the steps top to bottom, reporting),
`step.py` (the step's pure-torch pieces and its window of device values, shared with `raystream bench`),
`checkpoint.py` (what a checkpoint holds; the newest complete one on storage), `divergence.py` (`DivergedError`),
`preflight.py` (checks before any worker starts), `progress.py` (the console line), `faults.py` (the fault hooks
tests hand to `fit`, and the CLI's translation of the RAYSTREAM_* variables into them), `signals.py` (SIGTERM
handled as Ctrl-C). The lr and weight-decay schedules are raystream/schedule.py's.
Importing this package starts nothing; Ray, torch and MLflow are imported by the modules that use them.
"""

from raystream.train import model_files as _model_files

_model_files.install()  # tracking writes a run's LoggedModel files with train/model_files.py (it imports no models)
