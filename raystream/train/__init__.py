"""raystream.train: one run (scenario x optimizer x stream) as a Ray Train V2 job, with checkpoints and MLflow.

    raystream.train.commands.main(cfg) -> int       # `raystream train <overrides>`
    raystream.train.run.fit(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None,
                            options=None)  # RunOptions: init_checked, step_hooks (a test's faults), register
        -> dict of final metrics ('loss', 'eval/*', 'steps_done', 'start_step', 'mlflow_run_id', 'run_name',
           'run_dir', 'checkpoint_path'); raises DivergedError (raystream/train/divergence.py) at the first
           non-finite loss or gradient, `run.Interrupted` (a KeyboardInterrupt) on Ctrl-C

The command and the driver:
    commands.py        `raystream train` as the terminal sees it: the run's name and place, then its figures
    resolved.py        a run resolved once: config, videos, run directory, MLflow ids
    run.py             the driver: pre-flight, the MLflow run, TorchTrainer, the end (fit)
    run_end.py         how a run's MLflow run ends, through its record
    preflight.py       checks on the driver before any worker starts (ConfigError naming the key)
    correlation.py     the paper's Figure 1 as a pre-flight diagnostic: consecutive batches' gradient cosine
    capacity.py        what the Ray cluster can grow to (resources now, or every node type at its max_workers)
    ray_start.py       starting or joining Ray on the driver, for `raystream train` and `raystream sweep`
    guard.py           no process of a run outlives its command: the guard of the local Ray it starts
    lock.py            the directory lock of a run and of a sweep, local or in a bucket
    storage.py         where results live: trainer.storage_path, a directory or a URI
    inputs.py          a run's videos as the rows of its MLflow dataset inputs
    model_uri.py       `models:/` starts and targets, fetched into the node's cache
    model_files.py     a LoggedModel's files: an MLflow PyTorch model directory made from a checkpoint
    signals.py         SIGTERM handled as Ctrl-C
    faults.py          the fault hooks tests hand to `fit`, and the CLI's RAYSTREAM_* variables turned into them
    start.py           `raystream pretrain-start`: the Table 1 miniature's pretrained start, made and cached
The workers:
    loop.py            the per-worker loop Ray Train runs: setup, restore, the steps top to bottom, reporting
    worker.py          what one worker trains with: its config, rank, world size, device, scenario and stream
    step.py            the step's pure-torch pieces and its window of device values (shared with `raystream bench`)
    divergence.py      DivergedError: a run ends at its first non-finite loss or gradient
    drift.py           how far the weights moved from where they started (drift/<group>)
    progress.py        the console progress line (rank 0)
    checkpoint.py      what a checkpoint holds; the newest complete one on storage
    persist.py         rank 0's checkpoint written once, in place, to trainer.storage_path while training goes on
    evaluator.py       the evaluations of a model on every rank (eval.every, the end, `raystream eval`)
    node_metrics.py    which worker samples its node's system metrics (local rank 0)
    torch_backend.py   the torch.distributed set-up: raystream's loopback one, or Ray's TorchConfig
    loopback.py        torch.distributed's listeners on the loopback interface when all workers share a node
`raystream eval`:
    eval_job.py        `raystream eval <run dir | checkpoint | URI>`: a checkpoint's probes as a Ray Train job
    eval_target.py     what `raystream eval <target>` evaluates, resolved on the driver before Ray starts
The lr and weight-decay schedules are raystream/schedule.py's.
Importing this package starts nothing; Ray, torch and MLflow are imported by the modules that use them.
"""

from raystream.train import model_files as _model_files

_model_files.install()  # tracking writes a run's LoggedModel files with train/model_files.py (it imports no models)
