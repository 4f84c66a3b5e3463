"""The per-worker training loop that Ray Train runs on every worker (`train_loop_per_worker`).

Each worker builds the scenario, its shard of the clip stream (`build_stream(..., rank, world_size)`: batch size
`stream.batch_size // world_size`), the optimizer over the model's two param groups (decayed, and biases / norms /
ViT tokens without weight decay: `raystream.optim.param_groups`), the warm-up + cosine lr schedule and the optional
weight-decay schedule, then for every global step t:

    forward (bf16 autocast on GPU) -> backward (DDP all-reduces: every worker holds the global mean gradient)
    -> optional clipping -> weight decay of step t (when scheduled) -> optimizer step (the orthogonal projection
    acts on the all-reduced gradient) -> scheduler step -> scenario.after_step(t)

Loss and in-stream metrics are averaged over the workers; rank 0 alone logs to MLflow (each step once, see
raystream/tracking/logger.py), prints the progress line, evaluates, and writes checkpoints. Every
`trainer.checkpoint_every` steps (and after the last) all workers call `ray.train.report` with rank 0's
checkpoint; after a failure Ray Train restarts the workers, `ray.train.get_checkpoint()` returns the latest one and
the stream resumes at the exact next global batch.
"""

from __future__ import annotations

import contextlib
import logging
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from raystream.tracking import names
from raystream.train import checkpoint, faults
from raystream.train.progress import Progress
from raystream.train.schedule import build_scheduler, build_weight_decay_schedule, set_weight_decay


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def global_mean(values: List[torch.Tensor], world_size: int, device: torch.device) -> List[float]:
    """The mean over workers of each scalar (one all-reduce for all of them)."""
    vec = torch.stack([v.detach().float().reshape(()) for v in values]).to(device=device, dtype=torch.float64)
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        vec /= world_size
    return vec.cpu().tolist()


def _make_optimizer(params, optimizer_cfg):
    """The optimizer with its own diagnostics when it has them; else (plain torch) None: use GradCosineTracker."""
    from raystream.optim import build_optimizer

    name = str(optimizer_cfg.name)
    has_diagnostics = name.startswith("orthogonal") or name.startswith("slower")
    return build_optimizer(params, optimizer_cfg, diagnostics=has_diagnostics), has_diagnostics


class Evaluator:
    """Rank 0's evaluations: the probe set and held-out stream are loaded once, on first use."""

    def __init__(self, cfg, scenario):
        self.cfg, self.scenario = cfg, scenario
        self._probe = None
        self._heldout = None

    def __call__(self, model) -> Dict[str, float]:
        from raystream.data import build_heldout_stream, load_probe_set

        needs = set(getattr(self.scenario, "needs", ()))
        probe = heldout = None
        if "probe" in needs and list(self.cfg.eval.metrics):
            if self._probe is None:
                self._probe = load_probe_set(self.cfg.data, self.cfg.stream, self.cfg.eval)
            probe = self._probe
        if "heldout" in needs and int(getattr(self.cfg.eval, "heldout_batches", 1)) > 0:
            if self._heldout is None:
                self._heldout = build_heldout_stream(self.cfg.data, self.cfg.stream)
            heldout = self._heldout.batches(0)
        if probe is None and heldout is None:
            return {}
        # Evaluation must not move the training RNG streams (runs with and without evaluation stay identical).
        py_state, np_state = random.getstate(), np.random.get_state()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        try:
            with torch.random.fork_rng(devices=devices):
                out = self.scenario.evaluate(model, self.cfg.eval, probe=probe, heldout=heldout)
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
        return {names.eval_name(k): float(v) for k, v in out.items()}

    def close(self) -> None:
        if self._heldout is not None:
            self._heldout.close()


def _quiet_ray_train(level: str) -> None:
    """Apply `trainer.ray_log_level` to Ray Train's worker-side loggers (one INFO line per report otherwise).
    Some of them are named by file path (`logging.getLogger(__file__)`), outside the `ray.train` hierarchy."""
    for name in ["ray.train", *list(logging.root.manager.loggerDict)]:
        if name == "ray.train" or name.startswith("ray.train.") or "/ray/train/" in name.replace("\\", "/"):
            logging.getLogger(name).setLevel(level)


def train_loop_per_worker(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Ray Train entry point. `config`: {'cfg': resolved run config (dict), 'run': what the driver decided}.

    'run' holds run_name, total_steps, tracking_uri, mlflow_run_id and the test hooks (raystream/train/faults.py).
    Returns rank 0's final metrics (Ray's `Result.return_value`).
    """
    import ray.train
    import ray.train.torch

    from raystream.data import build_stream
    from raystream.models import build_scenario
    from raystream.models.scenario import unwrap
    from raystream.optim import GradCosineTracker, param_groups
    from raystream.tracking import StepLogger

    cfg = OmegaConf.create(config["cfg"])
    run = config["run"]
    tcfg = cfg.trainer
    _quiet_ray_train(str(tcfg.ray_log_level))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.set_num_threads(max(1, int(tcfg.cpus_per_worker)))
    seed_everything(int(tcfg.seed))
    total = int(run["total_steps"])
    hooks = run.get("hooks", {})

    scenario = build_scenario(cfg.scenario, cfg.stream, seed=int(tcfg.seed))
    if hasattr(scenario, "set_total_steps"):  # schedules inside the scenario (DoRA's teacher momentum)
        scenario.set_total_steps(total)
    stream = build_stream(cfg.data, cfg.stream, rank=rank, world_size=world)

    train_state: Dict[str, Any] = {}
    meta: Dict[str, Any] = {}
    restored = ray.train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as d:
            model_state, train_state, meta = checkpoint.load(Path(d))
        scenario.model.load_state_dict(model_state)
    model = ray.train.torch.prepare_model(
        scenario.model, parallel_strategy_kwargs={"find_unused_parameters": bool(tcfg.find_unused_parameters)})
    net = unwrap(model)
    groups = param_groups(net, cfg.optimizer)
    params = [p for group in groups for p in group["params"]]
    optimizer, has_diagnostics = _make_optimizer(groups, cfg.optimizer)
    scheduler = build_scheduler(optimizer, cfg.optimizer, total)
    weight_decay_at = build_weight_decay_schedule(cfg.optimizer, total)  # None: constant weight decay
    tracker = GradCosineTracker(params) if (rank == 0 and not has_diagnostics) else None

    start = 0
    sums: Dict[str, float] = {}
    count = 0
    last_eval: Dict[str, float] = {}
    if restored is not None:
        optimizer.load_state_dict(train_state["optimizer"])
        scheduler.load_state_dict(train_state["scheduler"])
        checkpoint.set_rng_state(train_state["rng"])
        sums, count = dict(train_state.get("sums", {})), int(train_state.get("count", 0))
        last_eval = dict(train_state.get("eval", {}))
        start = int(meta["next_step"])
        stream.load_state_dict(meta["stream"])
        if start >= total:  # finished already (or trainer.max_steps lowered below the checkpoint): nothing to train
            final = dict(train_state.get("final") or {"steps_done": start, **last_eval})
            final.update(start_step=start, mlflow_run_id=run["mlflow_run_id"])
            ray.train.report(final)
            stream.close()
            return final if rank == 0 else None

    logger = StepLogger(run["tracking_uri"], run["mlflow_run_id"]) if rank == 0 else None
    progress = Progress(run["run_name"], total, int(cfg.stream.batch_size), int(tcfg.log_every)) if rank == 0 else None
    evaluator = Evaluator(cfg, scenario) if rank == 0 else None
    if rank == 0:
        where = f"resuming at step {start}" if restored is not None else "starting"
        progress.say(f"{where}: {total} steps of {cfg.stream.batch_size} clips over {world} worker(s) on "
                     f"{device.type}")

    autocast = (torch.autocast(device_type="cuda", dtype=torch.bfloat16)
                if device.type == "cuda" and bool(tcfg.bf16) else contextlib.nullcontext())
    clip = float(getattr(cfg.optimizer, "grad_clip", 0.0) or 0.0)
    window_loss, window_n = 0.0, 0
    final: Dict[str, Any] = {}
    t_prev = time.perf_counter()

    def averages() -> Dict[str, float]:
        return {names.in_stream_average_name(k): v / count for k, v in sums.items()} if count else {}

    try:
        for batch in (iter(stream) if start < total else iter(())):
            t = int(batch.step)
            if t >= total:
                break
            faults.before_step(hooks, t, rank)
            with autocast:
                out = model(batch.model_inputs(device))
            loss = out["loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            step_metrics: Dict[str, float] = {}
            if clip > 0:
                step_metrics[names.GRAD_NORM] = float(torch.nn.utils.clip_grad_norm_(params, clip))
            elif rank == 0:
                step_metrics[names.GRAD_NORM] = float(torch.nn.utils.get_total_norm(
                    [p.grad for p in params if p.grad is not None]))
            if tracker is not None:
                step_metrics[names.GRAD_COS_PREV] = tracker.update()
            lr = float(optimizer.param_groups[0]["lr"])
            if weight_decay_at is not None:
                step_metrics[names.WD] = weight_decay_at(t)
                set_weight_decay(optimizer, step_metrics[names.WD])
            optimizer.step()
            if has_diagnostics and rank == 0:
                step_metrics.update(optimizer.diagnostics())
            scheduler.step()
            scenario.after_step(t)

            in_keys = sorted(k for k in out if k.startswith(names.IN_STREAM_PREFIX))
            values = global_mean([loss] + [out[k] for k in in_keys], world, device)
            scalars = dict(zip([names.LOSS] + in_keys, values))
            for key, value in scalars.items():
                sums[key] = sums.get(key, 0.0) + value
            count += 1
            window_loss += scalars[names.LOSS]
            window_n += 1
            now = time.perf_counter()
            done = t + 1
            is_last = done >= total

            if rank == 0:
                metrics = {**scalars, names.LR: lr, names.CLIPS_PER_S: int(cfg.stream.batch_size) / (now - t_prev),
                           **step_metrics}
                logger.log(metrics, t)
                progress.update(t, metrics)
                if done % int(tcfg.log_every) == 0:
                    logger.flush()
            t_prev = now

            every = int(cfg.eval.every)
            if rank == 0 and (is_last or (every > 0 and done % every == 0)):
                last_eval = evaluator(net)
                logger.log(last_eval, t)
                t_prev = time.perf_counter()

            report = {"step": t, "steps_done": done, names.LOSS: window_loss / max(window_n, 1), names.LR: lr,
                      **averages(), **last_eval}
            if is_last:
                final = {**report, "start_step": start, "mlflow_run_id": run["mlflow_run_id"]}
                if rank == 0:
                    logger.log(averages(), t)
                    logger.flush()
            if done % int(tcfg.checkpoint_every) == 0 or is_last:
                if rank == 0:
                    logger.flush()
                _report_with_checkpoint(
                    final or report, rank, done, net, optimizer, scheduler, stream, sums, count, last_eval, final,
                    run, total, world)
                window_loss, window_n = 0.0, 0
            elif done % int(tcfg.report_every) == 0:
                ray.train.report(report)
                window_loss, window_n = 0.0, 0
            if is_last:
                break
    finally:
        if logger is not None:
            logger.flush()
        if evaluator is not None:
            evaluator.close()
        stream.close()
    return final if rank == 0 else None


def _report_with_checkpoint(metrics, rank, next_step, net, optimizer, scheduler, stream, sums, count, last_eval,
                            final, run, total, world) -> None:
    """All ranks report; rank 0 attaches the checkpoint of the state after `next_step` steps."""
    import ray.train

    if rank != 0:
        ray.train.report(metrics, checkpoint=None, checkpoint_dir_name=checkpoint.dir_name(next_step))
        return
    stream_state = stream.state_dict()
    if int(stream_state.get("step", next_step)) != next_step:
        raise RuntimeError(f"stream state is at step {stream_state.get('step')} but {next_step} steps were trained")
    train_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "sums": dict(sums),
                   "count": count, "eval": dict(last_eval), "final": dict(final)}
    meta = {"next_step": next_step, "total_steps": total, "stream": stream_state, "world_size": world,
            "mlflow_run_id": run["mlflow_run_id"], "run_name": run["run_name"], "finished": bool(final)}
    with tempfile.TemporaryDirectory(prefix="raystream-ckpt-") as d:
        checkpoint.save(Path(d), model_state=net.state_dict(), train_state=train_state, meta=meta)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d),
                         checkpoint_dir_name=checkpoint.dir_name(next_step))
