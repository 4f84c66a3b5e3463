"""`raystream sweep`: a Ray Tune sweep whose trials are Ray Train runs, recorded as one MLflow parent run per sweep
and one child run per trial.

    plan (before Ray)  ->  lock  ->  MLflow parent run  ->  Tuner(grid x Optuna)  ->  outcomes
                                     (raystream.tracking.parent)   each trial: raystream.tune.trial -> fit(cfg)

This module runs the sweep and returns its `SweepOutcome`; `raystream sweep` (raystream/cli.py) prints its summary
and picks the exit code.

Ray Train V2 with Tune, as Ray 2.60 recommends: a function trainable is the driver of one `TorchTrainer` run
(`raystream.train.run.fit`), which reports to Tune through `TuneReportCallback`. The driver needs no CPU of its
own (it waits on the Train controller), so each trial requests no CPU (only a little memory) and
`max_concurrent_trials` is derived from what the cluster can grow to and the workers one trial needs
(`raystream.tune.concurrency`): an autoscaling cluster gets enough pending trials to add its nodes. A trial stopped
by ASHA has its driver actor killed; its Train workers
die with it and `raystream.tune.release` removes their placement group, so the next trial gets those CPUs.
A trial whose training raised (bad video, diverged loss, any error) is recorded as failed with its reason: a
FAILED child run with its grid and sampled values and the `raystream.error` tag (created when the trial failed
before its Train run made one), the Tune result, and the parent's `sweep/trials.json`; the sweep goes on
(`FailureConfig(max_failures=0)`: retrying is Ray Train's job, `trainer.max_failures`).

Before Ray starts: the plan (every cell's config checked), then the tracking store (`prepare_store`) and every
cell's inputs (its videos fill a global batch, its probe set lists, own videos have the evaluation data the
scenario needs, its start checkpoint fits), all checked together and reported together.

Resume: the run name defaults to `<sweep>-<hash of the planned trials>`; starting the same sweep again finds the
Tune experiment under `<storage>/sweeps/<run name>` (a local directory or a bucket: `raystream.train.storage`)
and `Tuner.restore`s it: finished trials are kept, unfinished
ones continue (each Train run resumes from its own checkpoint: its name is `<run name>-<trial id>`), failed ones
stay failed. The MLflow parent run id is kept beside the experiment, so the same parent run continues.
Ctrl+C (exit 130) or SIGTERM (exit 143) ends the parent run and the child runs of the interrupted trials as KILLED.
The parent's duration in MLflow is the time the sweep ran: its end time is its start time plus the seconds of every
session (tag `raystream.active_seconds`), so the pause between an interrupt and the resume is not counted.

A tracking outage: a trial that trains to the end while the store does not answer is finished, what MLflow lacks
of it waiting in its run's record (`<run dir>/events.jsonl`); when the store is still away as the sweep ends, the
sweep's end waits in the sweep's record, which names theirs (`raystream.tracking.parent.ParentClose`), the sweep
exits 1 naming `raystream tracking upload <record>`, and a resume writes it first.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import optuna
from omegaconf import DictConfig
from ray import tune
from ray.tune import ExperimentAnalysis
from ray.tune.schedulers import ASHAScheduler

from raystream.config import ConfigError
from raystream.tracking import events, names
from raystream.tracking.mirror import catch_up
from raystream.tracking.parent import META_FILE, ParentClose
from raystream.tracking.store import client as mlflow_client
from raystream.tracking.store import retry, tracking_uri
from raystream.train import signals
from raystream.train import storage as results
from raystream.train.preflight import raise_together
from raystream.train.ray_start import start_ray
from raystream.train.run import fit as train_fit
from raystream.tune import console
from raystream.tune.cell_checks import check_cells, store_problems
from raystream.tune.concurrency import trials_in_flight
from raystream.train.lock import SweepLock
from raystream.tune.release import ReleaseStoppedTrials
from raystream.tune.searcher import CELL_KEY
from raystream.tune.space import SweepPlan, plan
from raystream.tune.study_search import budget_estimates, finish_study, prepare_search
from raystream.tune.sweep_run import parent_run, view_columns
from raystream.tune.trial import RECORD_RESULT_KEY, error_text, trial_main, trial_tags

DRIVER_MEMORY = 200 * 1024 ** 2  # bytes reserved by each trial's driver (the function trainable)



@dataclass
class TrialOutcome:
    trial_id: str
    cell: Dict[str, Any]
    config: Dict[str, Any]  # the values this trial set (grid + sampled)
    status: str  # finished (incl. stopped early by ASHA) | failed | unfinished (interrupted: resume to run it)
    error: Optional[str] = None
    metrics: Dict[str, Any] = field(default_factory=dict)
    unsent: Optional[str] = None  # trained to the end during a tracking outage: its record, which MLflow lacks


@dataclass
class SweepOutcome:
    run_name: str
    path: str  # the Tune experiment: a local directory or a URI
    parent_run_id: str
    tracking_uri: str
    experiment: str
    resumed: bool
    trials: List[TrialOutcome]
    seconds: float
    experiment_id: str = ""
    unsent: Optional[str] = None  # the store did not answer at the end: the sweep's record, which MLflow lacks
    tracking_error: str = ""
    signal: str = "SIGINT"  # what interrupted it (SIGTERM: a job scheduler, `timeout`), when it was interrupted
    status: str = "FINISHED"  # its parent run's end (sweep_status): KILLED when interrupted
    reused: int = 0  # trials that finished before with the same identity: linked under the parent, not run

    @property
    def failed(self) -> List[TrialOutcome]:
        return [t for t in self.trials if t.status == "failed"]

    @property
    def interrupted(self) -> bool:
        """Ctrl+C (or SIGTERM) stopped the sweep before every trial ended, or before every planned trial was made
        (sweep_status); running it again resumes it."""
        return self.status == "KILLED"



def sweep_status(trials: List[TrialOutcome], planned: int, signalled: bool, reused: int = 0) -> str:
    """The parent run's status: KILLED when a trial was cut short or a signal came before every planned trial was
    made (Tune makes trials as slots free up, so a signal just after one ends leaves the next unmade and every made
    one ended; `reused` of the `planned` are not made: they finished before), else FINISHED when a trial finished
    or every one was reused, else FAILED."""
    if any(t.status == "unfinished" for t in trials) or (signalled and len(trials) < planned - reused):
        return "KILLED"
    if any(t.status == "finished" for t in trials) or (reused and not trials):
        return "FINISHED"
    return "FAILED"


def run_sweep(cfg: DictConfig, overrides: Sequence[str] = (), *, fit: Optional[Callable] = None,
              verbose: int = 0, quiet: Optional["console.QuietRay"] = None) -> SweepOutcome:
    """Plan, check, and run the sweep `cfg.sweep` to the end (or resume it). `fit` is the function each trial
    calls: `raystream.train.run.fit`, or a callable with its signature (tests use a small stand-in).
    `verbose` 0: one line per trial start and end and a few progress lines (`raystream.tune.console`), Ray's and
    Tune's output in the sweep's log file (`quiet`, else one of its own); 1 or 2: Tune's own output at that
    verbosity and Ray's, on the terminal."""
    if quiet is not None:
        return _run_sweep(cfg, overrides, fit, verbose, quiet)
    with console.QuietRay(enabled=not verbose) as own:
        return _run_sweep(cfg, overrides, fit, verbose, own)


@dataclass
class Sweep:
    """A sweep resolved once, before Ray starts: its config, its plan (every cell checked), the `fit` each trial
    calls, each cell's start-checkpoint line, the tracking URI, the storage, its run name and directory (`path`:
    `<storage>/sweeps/<run name>`) and what an earlier session left there (`meta`)."""

    cfg: DictConfig
    plan: SweepPlan
    fit: Callable
    init_lines: List[Optional[str]]
    uri: str
    storage: "results.Storage"
    run_name: str
    path: "results.Storage"
    meta: Optional[Dict[str, Any]]
    estimates: Optional[List[float]] = None  # with a budget: the plan's resource-hours of a trial of each cell
    search: Any = None  # this session's searcher (none when resumed: Tune restores its own)
    reused: Dict[int, Any] = field(default_factory=dict)  # cell -> the finished trial it reuses (tune/identity.py)


def _run_sweep(cfg: DictConfig, overrides: Sequence[str], fit: Optional[Callable], verbose: int,
               quiet: "console.QuietRay") -> SweepOutcome:
    """Plan and check before Ray starts, take the sweep's lock, open this session (Ray, the MLflow parent run),
    run the trials, end the session."""
    started = time.time()
    sweep = resolve_sweep(cfg, overrides, fit)
    lock = SweepLock(sweep.path, sweep.run_name).acquire()  # a second sweep of this name refuses, naming the first
    received: Dict[str, str] = {}  # SIGTERM stops the sweep as Ctrl-C does, once the trials run
    try:
        _start_ray_quietly(quiet, sweep)
        closing = _open_session(sweep)
        resumed, grid = _fit_trials(cfg, closing, received, lambda: _tuner(sweep, closing.parent, verbose))
        saved = _saved_trials(sweep.path.uri)
        trials = [_outcome(r, sweep.plan, saved) for r in grid]
        status = sweep_status(trials, sweep.plan.num_trials, signalled=bool(received), reused=len(sweep.reused))
        evals = sorted({k for t in trials for k in t.metrics if k.startswith(names.EVAL_PREFIX)})
        study = finish_study(sweep.uri, closing.parent, sweep.search, sweep.reused, sweep.plan.num_trials)
        for line in study:
            print(f"sweep {sweep.run_name}: {line}", file=console.terminal(), flush=True)
        error = closing.end(status, received.get("signal", "SIGINT"), trials=trials,
                            view=view_columns(sweep.plan, [str(cfg.sweep.metric), *evals]))
    finally:
        lock.release()
    return SweepOutcome(run_name=sweep.run_name, path=sweep.path.uri, parent_run_id=closing.parent,
                        tracking_uri=sweep.uri, experiment=cfg.mlflow.experiment, resumed=resumed, trials=trials,
                        seconds=time.time() - started, experiment_id=closing.experiment_id,
                        unsent=closing.saved, tracking_error=error or "", signal=received.get("signal", "SIGINT"),
                        status=status, reused=len(sweep.reused))


def resolve_sweep(cfg: DictConfig, overrides: Sequence[str], fit: Optional[Callable]) -> Sweep:
    """The sweep planned, its tracking store and every cell's inputs checked together (before Ray starts), each
    cell pointed at the store and the storage; its run name (`sweep.run_name`, else `<sweep>-<hash of the planned
    trials>`) and directory, whose sweep must be this one. With a `fit` of its own (tests), the cells' inputs are
    not checked."""
    the_plan = plan(cfg, overrides)  # raises ConfigError before Ray starts
    uri = tracking_uri(cfg)  # absolute: trials run in other processes and directories
    problems = store_problems(uri)
    init_lines: List[Optional[str]] = [None] * len(the_plan.cells)
    if fit is None:
        fit = train_fit
        init_lines = check_cells(the_plan, problems)
    raise_together(problems, f"sweep `{the_plan.name}`'s inputs")
    storage = results.resolve(cfg.trainer.storage_path)  # local directory or s3:// / gs:// URI, checked
    for cell in the_plan.cells:
        cell.config["mlflow"]["tracking_uri"] = uri
        cell.config["trainer"]["storage_path"] = storage.uri
    run_name = cfg.sweep.run_name or f"{the_plan.name}-{the_plan.fingerprint()}"
    path = storage.child("sweeps", run_name)
    meta = path.read_json(META_FILE)
    if meta and meta.get("fingerprint") != the_plan.fingerprint():
        raise ConfigError(f"config key `sweep.run_name` = {run_name!r}: {path.uri} holds a sweep with other "
                          "trials (its config changed); pick another sweep.run_name or leave it unset")
    estimates = budget_estimates(cfg, overrides)  # a budget below the plan refuses here (exit 2), the plan printed
    return Sweep(cfg, the_plan, fit, init_lines, uri, storage, run_name, path, meta, estimates)


def _start_ray_quietly(quiet: "console.QuietRay", sweep: Sweep) -> None:
    """Ray started (or joined) with its and Tune's output in the sweep's log file (said once, unless --verbose)."""
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")  # trials keep the driver's working directory
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # eval/* arrive only in the final report
    quiet_optuna()
    quiet.start(console.log_path(Path(sweep.path.path) if sweep.path.local else None, sweep.run_name))
    if quiet.log is not None:
        print(f"sweep {sweep.run_name}: {sweep.plan.num_trials} trials; Ray's and Tune's output: {quiet.log} "
              "(--verbose shows it here)", file=console.terminal(), flush=True)
    start_ray()  # RAY_ADDRESS when set, else a local cluster
    quiet.route_worker_output()


def _open_session(sweep: Sweep) -> ParentClose:
    """This session of the sweep: what the last one left unsent caught up, the MLflow parent run (the earlier
    sessions' one when resumed), the sweep's meta file written; the ParentClose that ends it."""
    experiment, uri, meta = sweep.cfg.mlflow.experiment, sweep.uri, sweep.meta
    catch_up(events.path_in(sweep.path.uri), "the end of this sweep's last session")  # before this session goes on
    parent = parent_run(uri, experiment, sweep.run_name, sweep.cfg, sweep.plan, meta)
    client = mlflow_client(uri)
    parent_info = retry(lambda: client.get_run(parent), "get parent run").info  # read now: the store may fail later
    session_start = time.time()
    meta = {"parent_run_id": parent, "fingerprint": sweep.plan.fingerprint(), "tracking_uri": uri,
            "experiment": experiment, "sweep": sweep.plan.name, "active_s": float((meta or {}).get("active_s", 0.0))
            if meta and meta.get("parent_run_id") == parent else 0.0}
    sweep.path.write_json(META_FILE, meta)
    return ParentClose(uri, parent_info, sweep.run_name, sweep.path, meta, session_start)


def _fit_trials(cfg: DictConfig, closing: ParentClose, received: Dict[str, str], make_tuner: Callable):
    """(resumed, Tune's ResultGrid): the trials run, SIGTERM handled as Ctrl-C (`received` names the signal).
    Interrupted, or Tune itself failed: the parent run ends KILLED / FAILED (what the store did not take waits in
    the sweep's record, said with the upload command) and the error goes on."""
    try:
        with signals.sigterm_as_sigint(received), _checkpoint_period(cfg.sweep.sync_period_s):
            resumed, tuner = make_tuner()
            return resumed, tuner.fit()
    except BaseException as exc:
        interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit)) or bool(received)
        error = closing.end("KILLED" if interrupted else "FAILED", received.get("signal", "SIGINT"),
                            failure=None if interrupted else error_text(exc))
        if error:
            print(f"raystream: sweep {closing.run_name} {'interrupted' if interrupted else 'failed'}, and the "
                  f"MLflow tracking store at {closing.uri} does not answer ({error}): the end of the session waits "
                  f"in {closing.saved}, and is written when the sweep resumes (or by `{events.UPLOAD_COMMAND} "
                  f"{shlex.quote(closing.saved)}`)", file=sys.stderr, flush=True)
        raise


@contextlib.contextmanager
def _checkpoint_period(seconds: float) -> Iterator[None]:
    """Tune saves its experiment state every TUNE_GLOBAL_CHECKPOINT_S (at least 10 s when "auto"), read when
    `tuner.fit()` builds its controller: this sweep's `sweep.sync_period_s` sets it for that sweep alone (a second
    sweep in the same process gets its own), unless the user set Tune's variable, which then wins."""
    name = "TUNE_GLOBAL_CHECKPOINT_S"
    if name in os.environ:
        yield
        return
    os.environ[name] = str(float(seconds))
    try:
        yield
    finally:
        os.environ.pop(name, None)



def _tuner(sweep: Sweep, parent: str, verbose: int):
    """(resumed, the Tuner): `Tuner.restore` of the experiment at `sweep.path` when there is one, else a new Tuner
    whose trials hang under MLflow parent run `parent`."""
    the_plan, run_name = sweep.plan, sweep.run_name
    info = {"name": the_plan.name, "run_name": run_name, "parent_run_id": parent, "sample_keys": list(the_plan.sample),
            "cell_values": [c.values for c in the_plan.cells], "fit": sweep.fit, "init_lines": sweep.init_lines}
    trainable = tune.with_parameters(trial_main, cells=[c.config for c in the_plan.cells], info=info)
    # The driver waits on its Train run: no CPU, a little memory (Ray needs a non-empty request).
    trainable = tune.with_resources(trainable, {"CPU": 0, "memory": DRIVER_MEMORY})
    resumed = tune.Tuner.can_restore(sweep.path.uri)
    progress = [console.SweepConsole([c.values for c in the_plan.cells], list(the_plan.sample))] if not verbose else []
    if resumed:
        tuner = tune.Tuner.restore(sweep.path.uri, trainable=trainable, resume_unfinished=True, resume_errored=False,
                                   restart_errored=False)
    else:
        sync = tune.SyncConfig(sync_period=float(sweep.cfg.sweep.sync_period_s))
        # Finished trials of the same identity reused and linked; the rest searched within the budget (issue 68).
        sweep.search, sweep.reused = prepare_search(sweep.cfg, the_plan, sweep.uri, parent, sweep.estimates,
                                                    lambda cell, trial: _reused_tags(info, cell, trial))
        tuner = tune.Tuner(trainable, tune_config=_tune_config(sweep.cfg, the_plan, sweep.search),
                           run_config=tune.RunConfig(name=run_name, storage_path=sweep.storage.child("sweeps").uri,
                                                     failure_config=tune.FailureConfig(max_failures=0),
                                                     callbacks=[ReleaseStoppedTrials(), *progress],
                                                     sync_config=sync, verbose=verbose))
    return resumed, tuner


def quiet_optuna() -> None:
    """Optuna logs every trial it creates at INFO; the sweep prints its own progress."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _reused_tags(info: Dict[str, Any], cell: int, trial_id: str) -> Dict[str, str]:
    """The child-run tags of a reused trial's link: a trial's, named by its grid values."""
    return {**trial_tags(info, cell, trial_id, {}), names.RUN_NAME_TAG: names.trial_run_name(info["cell_values"][cell])}


def _tune_config(cfg: DictConfig, the_plan: SweepPlan, searcher):
    """Tune's settings of a new sweep: `searcher` (study_search.search_algorithm), ASHA when asked, concurrency."""
    sweep = cfg.sweep
    scheduler = None
    if sweep.scheduler == "asha":
        scheduler = ASHAScheduler(time_attr="training_iteration", grace_period=int(sweep.grace_period),
                                  reduction_factor=int(sweep.reduction_factor), max_t=10 ** 9)
    return tune.TuneConfig(metric=sweep.metric, mode=sweep.mode, search_alg=searcher, scheduler=scheduler,
                           num_samples=the_plan.num_trials,
                           max_concurrent_trials=trials_in_flight(sweep.max_concurrent_trials, the_plan),
                           trial_dirname_creator=_trial_dirname)


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def _saved_trials(path: str) -> Dict[str, Any]:
    """Each trial as Tune saved it for a restore (`.status`: TERMINATED, ERROR, or PENDING for a trial an interrupt
    stopped: in memory Tune marks those TERMINATED; `.config`: its values, also for a trial that failed in an
    earlier session, whose restored result carries no config). `path`: a local directory or a bucket URI."""
    try:
        return {t.trial_id: t for t in ExperimentAnalysis(path).trials}
    except Exception as exc:  # no saved state: treat results without an error as finished
        print(f"raystream: could not read the trial states of {path}: {exc}", file=sys.stderr)
        return {}


def _outcome(result, the_plan: SweepPlan, saved: Dict[str, Any]) -> TrialOutcome:
    metrics = dict(result.metrics or {})
    trial_id = str(metrics.get("trial_id") or Path(str(result.path)).name.replace("trial_", ""))
    trial = saved.get(trial_id)
    config = dict(result.config or (trial.config if trial is not None else None) or {})
    cell = the_plan.cells[int(config[CELL_KEY])].values if CELL_KEY in config else {}
    status = trial.status if trial is not None else "TERMINATED"
    if result.error is None and status not in ("TERMINATED", "ERROR"):
        return TrialOutcome(trial_id, cell, config, "unfinished", metrics=metrics)
    if result.error is not None:
        return TrialOutcome(trial_id, cell, config, "failed", error=error_text(result.error), metrics=metrics)
    return TrialOutcome(trial_id, cell, config, "finished", metrics=metrics,
                        unsent=metrics.get(RECORD_RESULT_KEY) or None)

