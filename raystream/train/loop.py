"""The per-worker training loop that Ray Train runs on every worker (`train_loop_per_worker`), in three pieces:

    setup    (`Worker.build`, worker.py) the typed config, the scenario, this worker's shard of the clip stream
             (`build_stream(..., rank, world_size)`: batch size `stream.batch_size // world_size`), the model under
             DDP, the optimizer over the model's two param groups (`raystream.optim.param_groups`), the schedules;
    restore  (`restore`)       the newest checkpoint (Ray Train's, or the newer complete one the driver found on
             storage): model, optimizer, the previous gradient of `grad_cos_prev`, RNG, stream position, sums;
    measure  (`measure_correlation`) on a fresh run only, before step 0: the stream correlation at the initial
             weights, each rank on its shard and device, under the step's autocast, in micro-batches of the
             per-worker batch, summed over ranks; rank 0 logs it at step 0;
    steps    (`train_steps`, read top to bottom like DINO's `train_one_epoch`) for every global step t:

        load the batch (the stream copies it to the device ahead of the step) -> schedules of step t (lr, weight
        decay) -> forward (bf16 autocast when `trainer.bf16` asks for it) -> backward (DDP all-reduces: every
        worker holds the global mean gradient) -> gradient norm (clipped when `optimizer.grad_clip` > 0) ->
        optimizer step (the orthogonal projection acts on the all-reduced gradient) -> scenario.after_step(t);
        the step's values stay on the device (a `StepWindow`; these pure-torch pieces are step.py's, shared with
        `raystream bench`, which imports no Ray)

    read-back (`read_window`) after every `trainer.log_every`-th step (and at report, checkpoint and evaluation
             steps): the window's values in ONE host transfer, each step checked finite and recorded in order;
             then the evaluation (when due), the disk-space check, the report and checkpoint (when due);

    and reporting (`Records` on rank 0: MLflow, progress line; evaluations on every rank at once, each its part of
    the work (raystream/train/evaluator.py), with rank 0's `drift/*` beside them (raystream/train/drift.py: θ_0
    taken when the worker is built, before any restore); `report` on every rank: Ray Train
    reports, every `trainer.checkpoint_every` steps and after the last with rank 0's checkpoint).

Loss and in-stream metrics are averaged over the workers. A non-finite loss or gradient norm ends the run at that
step (raystream/train/divergence.py), found at the next read-back: at most `trainer.log_every - 1` more steps run
on, and are neither recorded nor checkpointed. The workers return instead of raising, so Ray Train spends no retry
on it. A full disk (`raystream.diskspace.DiskFull`, from rank 0's checkpoint or record write) is returned likewise,
every rank stopping at the same read-back (`persist.stop_for_space`).
After a machine fault Ray Train restarts the workers and the stream resumes at the exact next global batch.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import ray.train

from raystream import diskspace
from raystream.eval.shard import Shard
from raystream.tracking import StepLogger, names, registry
from raystream.train import checkpoint, divergence, persist
from raystream.train.correlation import figures, measure_model, not_measured, per_worker_batch
from raystream.train.evaluator import Evaluator, rng_kept
from raystream.train.node_metrics import start_node_monitor
from raystream.train.progress import Progress
from raystream.train.step import StepWindow, finite_check_values, forward_backward, optimizer_update, read_back_due
from raystream.train.worker import Worker


@dataclass
class LoopState:
    """What the loop carries from step to step; everything but the report window is in the checkpoint."""

    start: int = 0  # the step this attempt started at
    next_step: int = 0
    sums: Dict[str, float] = field(default_factory=dict)  # in-stream metrics (and loss) summed over the steps
    count: int = 0
    last_eval: Dict[str, float] = field(default_factory=dict)
    final: Dict[str, Any] = field(default_factory=dict)
    window_loss: float = 0.0  # loss summed since the last Ray Train report
    window_n: int = 0
    checkpoints: persist.Checkpointer = field(default_factory=persist.Checkpointer)  # rank 0's checkpoint writes
    drift_start: Dict[str, Any] = field(default_factory=dict)  # the fingerprint of the run's θ_0 (drift.py)

    def add(self, scalars: Dict[str, float]) -> None:
        for key, value in scalars.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.count += 1
        self.window_loss += scalars[names.LOSS]
        self.window_n += 1

    def averages(self) -> Dict[str, float]:
        return {names.in_stream_average_name(k): v / self.count for k, v in self.sums.items()} if self.count else {}

    def take_window_loss(self) -> float:
        mean = self.window_loss / max(self.window_n, 1)
        self.window_loss, self.window_n = 0.0, 0
        return mean


def _checkpoint_to_restore(run: Dict[str, Any]):
    """The newest of Ray Train's latest registered checkpoint, the driver's `resume_from` (the newest complete one
    on storage when the run started) and the newest complete one on storage now (a restart after a fault: written
    in full by the failed attempt, whose report Ray Train may not have taken), or None."""
    storage = ray.train.get_context().get_storage()
    now = checkpoint.newest_complete(storage.storage_filesystem, storage.experiment_fs_path)
    return checkpoint.restorable([ray.train.get_checkpoint(), run.get("resume_from"),  # verified: a torn one skipped
                                  ray.train.Checkpoint(now, filesystem=storage.storage_filesystem) if now else None])


def restore(w: Worker) -> LoopState:
    """Load the checkpoint to resume from into `w` (model, optimizer, grad_cos_prev's previous gradient, RNG,
    stream position); the loop state it held. A fresh `LoopState` when there is none."""
    ckpt = _checkpoint_to_restore(w.run)
    if ckpt is None:
        return LoopState()
    checkpoints = persist.Checkpointer(persist.registered_names(), Path(ckpt.path).name) if w.rank == 0 else None
    with ckpt.as_directory() as d:
        model_state, train_state, meta = checkpoint.load(Path(d))
    w.net.load_state_dict(model_state)
    w.optimizer.load_state_dict(train_state["optimizer"])
    if w.cosines is not None and "diagnostics" in train_state:
        w.cosines.load_diagnostics_state_dict(train_state["diagnostics"])
    checkpoint.set_rng_state(train_state["rng"])
    start = int(meta["next_step"])
    w.stream.load_state_dict(meta["stream"])
    drift_start = dict(train_state.get("drift_start") or {})
    differ = w.drift.matches(drift_start) if w.drift is not None else []
    if differ:  # the config no longer rebuilds the start this run was trained from (another backbone.init file)
        print(f"raystream: the start rebuilt from the config is not the one checkpoint {Path(ckpt.path).name} was "
              f"trained from ({', '.join(differ)} differ): drift/* is not logged for the rest of this run",
              file=sys.stderr, flush=True)
        w.drift = None
    return LoopState(start=start, next_step=start, sums=dict(train_state.get("sums", {})),
                     count=int(train_state.get("count", 0)), last_eval=dict(train_state.get("eval", {})),
                     final=dict(train_state.get("final") or {}), checkpoints=checkpoints or persist.Checkpointer(),
                     drift_start=drift_start)


def read_window(window: StepWindow, state: LoopState, records: "Records") -> None:
    """Read the window back (one transfer) and record its steps in order. Raises DivergedError, on every worker
    alike, at the first step whose loss or gradient norm is not finite: it and the steps after it are not
    recorded (the loss is averaged over the workers and the gradients are DDP's, so all see the same values)."""
    for t, scalars, metrics in window.read():
        divergence.check_finite(t, finite_check_values(scalars, metrics))
        state.add(scalars)
        state.next_step = t + 1
        records.step(t, {**scalars, **metrics})


class Records:
    """Rank 0's outputs: every step's metrics to the run's record and MLflow (`StepLogger`, each step once) and the
    progress line; the evaluations, which run on every rank (raystream/train/evaluator.py). On other ranks it only
    evaluates."""

    def __init__(self, w: Worker, start: int):
        self.w = w
        self.active = w.rank == 0
        batch_size = w.cfg.stream.batch_size
        self.logger = StepLogger(w.run["tracking_uri"], w.run["mlflow_run_id"], record=w.run["record"]) \
            if self.active else None
        self.progress = Progress(w.run["run_name"], w.total, batch_size, w.cfg.trainer.log_every) \
            if self.active else None
        self.evaluator = Evaluator(w.cfg, w.scenario, Shard(w.rank, w.world), hooks=w.run.get("hooks"))
        self._t_prev = time.perf_counter()
        self.seconds: Dict[str, float] = {"evaluation": 0.0, "checkpoint": 0.0}  # summed over the run's phases
        self.full: Optional[diskspace.DiskFull] = None  # the record's write that failed for space (rank 0)
        if self.active:
            where = f"resuming at step {start}" if start > 0 else "starting"
            self.progress.say(f"{where}: {w.total} steps of {batch_size} clips over {w.world} worker(s) on "
                              f"{w.device.type}")

    def clips_per_s(self) -> float:
        """Clips per second since the previous call (host time: without a sync per step the device catches up at
        each read-back, so a window's figures add up to its throughput)."""
        now = time.perf_counter()
        rate, self._t_prev = self.w.cfg.stream.batch_size / max(now - self._t_prev, 1e-9), now
        return rate

    def step(self, t: int, metrics: Dict[str, float]) -> None:
        """Step t's metrics (read back): to MLflow and the progress line."""
        if self.active:
            self._write(lambda: self.logger.log(metrics, t))
            self.progress.update(t, metrics)
            if (t + 1) % self.w.cfg.trainer.log_every == 0:
                self._write(lambda: self.logger.flush())

    def _write(self, write: Callable[[], None]) -> None:
        """A write to rank 0's record. The first that fails for space is kept (`full`) and the writes after it are
        left out, so that rank 0 goes on to where every rank agrees to stop (`persist.stop_for_space`)."""
        if self.active and self.full is None:
            try:
                write()
            except diskspace.DiskFull as exc:
                self.full = exc

    def evaluate(self, t: int, state: LoopState) -> None:
        """Evaluate after step t when `eval.every` or the end asks for it: every rank at once (each its part of the
        probe set and of the probes' mini-batches), rank 0 logs the metrics."""
        every, done = self.w.cfg.eval.every, t + 1
        if done >= self.w.total or (every > 0 and done % every == 0):
            began = time.perf_counter()
            state.last_eval = self.evaluator(self.w.net)
            if self.w.drift is not None:  # rank 0: how far the weights moved, beside each evaluation
                state.last_eval.update({names.drift_name(k): v for k, v in self.w.drift.measure().items()})
            self._write(lambda: self.logger.log(state.last_eval, t))
            self._t_prev = time.perf_counter()
            self.seconds["evaluation"] += self._t_prev - began

    def log_phases(self, seconds: Dict[str, float], t: int) -> None:
        """`time/<phase>_s` at step t: where this worker's time went (start, correlation, steps, checkpoint,
        evaluation), so a run that grew shows which phase grew."""
        self.log({f"{names.TIME_PREFIX}{k}_s": v for k, v in {**seconds, **self.seconds}.items()}, t)

    def log(self, metrics: Dict[str, float], t: int) -> None:
        self._write(lambda: self.logger.log(metrics, t))

    def flush(self) -> None:
        self._write(lambda: self.logger.flush())

    def close(self) -> None:
        if self.active:
            self.logger.close()  # what the tracking store did not take waits in the record (the driver tells)
        self.evaluator.close()


def report(w: Worker, state: LoopState, records: Records, t: int, lr: float) -> bool:
    """After step t: on every worker, `ray.train.report` every `trainer.report_every` steps; with rank 0's
    checkpoint every `trainer.checkpoint_every` steps and after the last (then `state.final` is set). Whether
    this step checkpointed (the same on every rank)."""
    done = t + 1
    tcfg = w.cfg.trainer
    is_last = done >= w.total
    if not (is_last or done % tcfg.checkpoint_every == 0 or done % tcfg.report_every == 0):
        return False
    metrics = {"step": t, "steps_done": done, names.LOSS: state.take_window_loss(), names.LR: lr,
               **state.averages(), **state.last_eval}
    if is_last:
        state.final = {**metrics, "start_step": state.start, "mlflow_run_id": w.run["mlflow_run_id"]}
        records.log(state.averages(), t)
    if is_last or done % tcfg.checkpoint_every == 0:
        records.flush()
        began = time.perf_counter()
        report_with_checkpoint(w, state, state.final or metrics)
        records.seconds["checkpoint"] += time.perf_counter() - began
        return True
    ray.train.report(metrics)
    return False


def report_with_checkpoint(w: Worker, state: LoopState, metrics: Dict[str, Any]) -> None:
    """All ranks report `metrics`; rank 0 attaches the checkpoint of the state before step `state.next_step`."""
    name = checkpoint.dir_name(state.next_step)
    if w.rank != 0:
        ray.train.report(metrics, checkpoint=None, checkpoint_dir_name=name)
        return
    stream_state = w.stream.state_dict()
    if int(stream_state.get("step", state.next_step)) != state.next_step:
        raise RuntimeError(f"stream state is at step {stream_state.get('step')} but {state.next_step} steps were "
                           "trained")
    meta = {"next_step": state.next_step, "total_steps": w.total, "stream": stream_state, "world_size": w.world,
            "mlflow_run_id": w.run["mlflow_run_id"], "run_name": w.run["run_name"], "finished": bool(state.final)}

    def take(copy: bool) -> checkpoint.Snapshot:  # with `copy` the step waits for the copy, not for the write
        train_state = {"optimizer": w.optimizer.state_dict(), "sums": dict(state.sums), "count": state.count,
                       "eval": dict(state.last_eval), "final": dict(state.final),
                       "diagnostics": w.cosines.diagnostics_state_dict() if w.cosines is not None else {},
                       "drift_start": state.drift_start or (w.drift.fingerprint() if w.drift is not None else {})}
        return checkpoint.snapshot(model_state=w.net.state_dict(), train_state=train_state, meta=meta, copy=copy)

    state.checkpoints.report(metrics, name, take)


def _finished_already(w: Worker, state: LoopState) -> Dict[str, Any]:
    """A restore at or past the last step (a finished run, or `trainer.max_steps` lowered): nothing to train. Its
    checkpoint is reported again, so it is the run's result (and kept) whichever checkpoint Ray had registered."""
    final = dict(state.final or {"steps_done": state.next_step, **state.last_eval})
    final.update(start_step=state.start, mlflow_run_id=w.run["mlflow_run_id"])
    state.final = final
    report_with_checkpoint(w, state, final)
    return final


def measure_correlation(w: Worker, records: "Records") -> None:
    """The stream correlation (raystream/train/correlation.py) at the initial weights, on every rank's device and
    shard, before step 0; rank 0 logs the figures at step 0. A stream without two consecutive batches, or a
    non-finite loss, is said on stderr and skipped (the same on every rank, so none waits for another)."""
    tcfg = w.cfg.trainer
    if w.rank == 0:
        records.progress.say(f"measuring the stream correlation: {tcfg.correlation_steps} pairs of global batches "
                             f"per order, micro-batches of {per_worker_batch(w.cfg)} clips per worker")
    try:
        with rng_kept():
            result = measure_model(w.net, w.cfg, w.stream.stream, steps=int(tcfg.correlation_steps),
                                   device=w.device, micro_batch=per_worker_batch(w.cfg), rank=w.rank,
                                   world_size=w.world, autocast=w.autocast)
    except ValueError as exc:
        if w.rank == 0:
            not_measured(exc)
        return
    if result is not None:
        records.log(figures(result), 0)
        records.flush()


def train_loop_per_worker(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Ray Train entry point. `config`: {'cfg': resolved run config (dict), 'run': what the driver decided}.

    Returns rank 0's final metrics (Ray's `Result.return_value`), or `divergence.as_result(...)` when the run
    diverged; None on the other ranks.
    """
    began = time.perf_counter()
    registry.use(config["run"].get("tracking_uri"))  # a `models:/` start is fetched from the run's tracking server
    w = Worker.build(config)
    state = restore(w)
    if state.next_step >= w.total:
        final = _finished_already(w, state)
        w.stream.close()
        return final if w.rank == 0 else None
    records = Records(w, state.start)
    monitor = start_node_monitor(w.cfg, w.run, gpus=w.device.type == "cuda")  # local rank 0: its node's metrics
    full: Optional[diskspace.DiskFull] = None
    phases = {"start": time.perf_counter() - began}
    try:
        if w.run.get("measure_correlation") and state.next_step == 0:  # a fresh run, not a resume
            measure_correlation(w, records)
        phases["correlation"] = time.perf_counter() - began - phases["start"]
        hooks = w.run.get("hooks")  # what a test injects from outside the step (faults.py), if anything
        batches = w.stream if hooks is None else hooks.around_steps(w.stream, w.rank, w.total)
        stopped = train_steps(w, state, records, batches)
        if isinstance(stopped, diskspace.DiskFull):
            raise stopped
        phases["steps"] = (time.perf_counter() - began - phases["start"] - phases["correlation"]
                           - sum(records.seconds.values()))
        records.log_phases(phases, max(state.next_step - 1, 0))
        if stopped is not None:
            return divergence.as_result(stopped) if w.rank == 0 else None
    except diskspace.DiskFull as exc:  # rank 0's disk: every rank stops at once (train_steps), no retry
        full = exc
    finally:
        persist.wait()  # a checkpoint write in flight ends complete before an error reaches Ray Train (and a restart)
        monitor.stop()
        try:
            records.close()
        except diskspace.DiskFull:
            if full is None:
                raise
        w.stream.close()
    if full is not None:
        return diskspace.as_result(full) if w.rank == 0 else None
    return state.final if w.rank == 0 else None


OTHER_RANK_STOPPED = diskspace.DiskFull("rank 0's storage", None, None, "rank 0 ran out of space")


def train_steps(w: Worker, state: LoopState, records: "Records", batches) -> Optional[Exception]:
    """Train on `batches` up to the run's last step, reading the values back once per window (`read_back_due`),
    then evaluating and reporting. Each step's values stay on the device until then: its loss and in-stream
    metrics (averaged over the workers at read-back), this worker's gradient norm, grad_cos_prev and the
    optimizer's diagnostics (rank 0). Returns what stopped the run early: the DivergedError when it diverged (its
    steps before are recorded and flushed), or the DiskFull of rank 0's record or checkpoint (on every rank: all
    stop at the same window); None when it ran to its end."""
    window = StepWindow(w.world, w.device)
    for batch in batches:  # this worker's shard of global step t, already on its way to the device
        t = int(batch.step)
        if t >= w.total:
            break
        host = w.schedules.apply(w.optimizer, t)
        out, grad_norm = forward_backward(w.model, w.optimizer, w.params, batch.model_inputs(w.device), w.autocast,
                                          w.cfg.optimizer.grad_clip)
        local = {names.GRAD_NORM: grad_norm, **optimizer_update(w.optimizer, w.cosines, report=w.rank == 0)}
        w.scenario.after_step(t)
        means = {names.LOSS: out["loss"], **{k: out[k] for k in sorted(out) if k.startswith(names.IN_STREAM_PREFIX)}}
        window.add(t, means, local, {**host, names.CLIPS_PER_S: records.clips_per_s()})
        if not read_back_due(w.cfg, t, w.total):
            continue
        try:
            read_window(window, state, records)
        except divergence.DivergedError as exc:
            records.flush()
            return exc
        records.evaluate(t, state)  # on every rank, whatever rank 0's record did: its collectives need them all
        if persist.stop_for_space(w.world, w.device, records.full):
            return records.full or OTHER_RANK_STOPPED
        full = None
        try:
            checkpointed = report(w, state, records, t, float(w.optimizer.param_groups[0]["lr"]))
        except diskspace.DiskFull as exc:  # rank 0's checkpoint (reported without it: the others went on)
            checkpointed, full = True, exc
        # only a checkpoint's report writes (its files, the record's flush): agreed there, not at every read-back
        if checkpointed and persist.stop_for_space(w.world, w.device, full or records.full):
            return full or records.full or OTHER_RANK_STOPPED
        if state.next_step >= w.total:
            break
    return None
