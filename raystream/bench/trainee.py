"""What `raystream bench` trains: the configured scenario, model and optimizer on one device, built as a training
worker builds them (raystream/train/loop.py `Worker.build`, without Ray or DDP), the worker's shard of the stream,
and the time budget every phase draws from.

One step is the worker's step: the lr and weight-decay schedules, `forward_backward` (raystream/train/step.py),
loss and gradient norm read back in one host transfer and checked finite, `optimizer_update`, the scenario's
`after_step`. Not measured: DDP's gradient all-reduce across GPUs, evaluation, MLflow (a checkpoint save is
measured for its memory: memory.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, List

import torch
from omegaconf import OmegaConf

from raystream.data import DeviceStream, build_stream
from raystream.data.decode.workers import available_cores
from raystream.models import build_scenario
from raystream.models.vit import compile_blocks, compile_wanted
from raystream.optim import GradCosineTracker, build_optimizer, param_groups
from raystream.schedule import Schedules
from raystream.train.step import autocast_for, forward_backward, optimizer_update


class BenchError(ValueError):
    """Bad input to `raystream bench` (a device that is not there, a stream too short): nothing was timed."""


class CheckFailed(RuntimeError):
    """A check before timing failed; `name` says which (device_stream, compiled_step, bf16_step, finite_step)."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"check `{name}` failed: {detail}")
        self.name = name


class Budget:
    """The wall-clock seconds the whole command may take; each phase asks what is left before it starts."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()


def resolve_device(name) -> torch.device:
    """`--device` as a torch device: None = CUDA when torch sees a GPU, else CPU. Raises BenchError for
    `cuda` on a machine (or torch build) without one."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError(f"--device {name}: torch {torch.__version__} sees no CUDA device "
                         f"(torch.cuda.is_available() is False; torch.version.cuda = {torch.version.cuda}); run it on "
                         "a GPU machine with a CUDA build of torch, or pass --device cpu")
    return device


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; a CPU step has finished when it returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)

    return f"CPU, {available_cores()} cores, {torch.get_num_threads()} torch thread(s)"


@dataclass
class Trainee:
    """One worker's model, optimizer and schedules on `device`; `step(batch)` trains one step as the worker does."""

    cfg: Any
    device: torch.device
    scenario: Any
    model: torch.nn.Module
    groups: List[dict]
    params: List[torch.Tensor]
    optimizer: torch.optim.Optimizer
    cosines: Any
    schedules: Schedules
    autocast: Callable[[], ContextManager]
    t: int = 0

    @property
    def batch_size(self) -> int:
        """The per-worker batch: `stream.batch_size // trainer.num_workers` clips."""
        return int(self.cfg.stream.batch_size) // int(self.cfg.trainer.num_workers)

    @classmethod
    def build(cls, cfg, device: torch.device, total_steps: int) -> "Trainee":
        torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)))
        torch.manual_seed(int(cfg.trainer.seed))
        scenario = build_scenario(cfg.scenario, cfg.stream, seed=int(cfg.trainer.seed))
        scenario.set_total_steps(total_steps)
        model = scenario.model.to(device)
        if compile_wanted(cfg.trainer.compile, device):  # trainer.compile, as the worker
            compile_blocks(model)
        model.train()
        groups = param_groups(model, cfg.optimizer)
        params = [p for group in groups for p in group["params"]]
        optimizer = build_optimizer(groups, cfg.optimizer, diagnostics=True, total_steps=total_steps)
        cosines = optimizer if hasattr(optimizer, "diagnostics") else GradCosineTracker(params)
        return cls(cfg=cfg, device=device, scenario=scenario, model=model, groups=groups, params=params,
                   optimizer=optimizer, cosines=cosines, schedules=Schedules(cfg.optimizer, total_steps),
                   autocast=autocast_for(cfg.trainer, device))

    def step(self, batch, autocast=None) -> float:
        """One training step on `batch` (its tensors on the device); returns the loss. Raises CheckFailed
        (`finite_step`) when the loss or the gradient norm is not finite."""
        t = self.t
        self.schedules.apply(self.optimizer, t)
        out, norm = self.forward_backward(batch, autocast)
        loss, norm = torch.stack([out["loss"].detach().float(), norm.detach().float()]).tolist()  # one transfer
        if not (math.isfinite(loss) and math.isfinite(norm)):
            raise CheckFailed("finite_step", f"step {t}: loss {loss}, gradient norm {norm} (not finite)")
        self.update()
        return loss

    def forward_backward(self, batch, autocast=None):
        """The step's forward and backward (step.py): (the model's output dict, the gradient norm), on the device."""
        return forward_backward(self.model, self.optimizer, self.params, batch.model_inputs(self.device),
                                autocast or self.autocast, float(self.cfg.optimizer.grad_clip))

    def update(self):
        """The optimizer step and the scenario's `after_step` after a checked backward; the optimizer's metrics
        (device tensors, nothing read back)."""
        metrics = optimizer_update(self.optimizer, self.cosines, report=True)
        self.scenario.after_step(self.t)
        self.t += 1
        return metrics


def build_host_stream(cfg, needed: int, decode_workers=None):
    """This worker's shard (rank 0 of `trainer.num_workers`) of the configured stream with at least `needed`
    steps (more passes when one is shorter), decoded by `decode_workers` threads (None: `data.decode_workers`)."""
    data = cfg.data if decode_workers is None else OmegaConf.merge(cfg.data, {"decode_workers": int(decode_workers)})
    world = int(cfg.trainer.num_workers)
    stream = build_stream(data, cfg.stream, rank=0, world_size=world)
    if stream.num_steps >= needed:
        return stream
    passes = math.ceil(needed * int(cfg.stream.epochs) / stream.num_steps)
    stream.close()
    return build_stream(data, OmegaConf.merge(cfg.stream, {"epochs": passes}), rank=0, world_size=world)


def build_device_stream(cfg, device: torch.device, needed: int, decode_workers=None):
    """`build_host_stream` behind DeviceStream, as a worker reads it (uint8 to the device, copied ahead)."""
    return DeviceStream(build_host_stream(cfg, needed, decode_workers), device)
