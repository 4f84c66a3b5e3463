"""What one Ray Train worker trains with: its config (re-typed), rank, world size and device, the scenario and its
model (its ViT blocks compiled per `trainer.compile`; under DDP when world > 1), the stream of its shard, the
optimizer and its schedules, the drift start. Built once per (re)start of the worker by `Worker.build`; the loop
(loop.py) trains with it.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, List, Optional

import numpy as np
import ray.train
import ray.train.torch
import torch
from omegaconf import DictConfig, OmegaConf

from raystream.config import RunConfig
from raystream.data import DeviceStream, build_stream
from raystream.models import build_scenario
from raystream.models.scenario import unwrap
from raystream.models.vit import compile_blocks, compile_wanted
from raystream.optim import GradCosineTracker, build_optimizer, param_groups
from raystream.schedule import Schedules
from raystream.train.drift import Drift
from raystream.train.model_uri import fetched
from raystream.train.step import autocast_for


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def typed_config(plain: Dict[str, Any]) -> DictConfig:
    """The run config the driver sent as a plain dict, re-typed with the schema it was composed on (`RunConfig`)."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), plain)


def _quiet_ray_train(level: str) -> None:
    """Apply `trainer.ray_log_level` to Ray Train's worker-side loggers (one INFO line per report otherwise).
    Some of them are named by file path (`logging.getLogger(__file__)`), outside the `ray.train` hierarchy."""
    for name in ["ray.train", *list(logging.root.manager.loggerDict)]:
        if name == "ray.train" or name.startswith("ray.train.") or "/ray/train/" in name.replace("\\", "/"):
            logging.getLogger(name).setLevel(level)


@dataclass
class Worker:
    """What one worker trains with; built once per (re)start by `Worker.build`."""

    cfg: DictConfig
    run: Dict[str, Any]  # from the driver: run_name, total_steps, tracking_uri, mlflow_run_id, resume_from, hooks
    total: int  # the run's number of steps (`run['total_steps']`)
    rank: int
    world: int
    device: torch.device
    scenario: Any
    stream: Any
    model: torch.nn.Module  # as Ray Train prepared it (DDP when world > 1)
    net: torch.nn.Module  # the model itself (what is checkpointed and evaluated)
    params: List[torch.Tensor]
    optimizer: torch.optim.Optimizer
    schedules: Schedules
    cosines: Any  # what gives grad_cos_prev: the optimizer (its diagnostics), a GradCosineTracker, or None
    autocast: Callable[[], ContextManager]
    drift: Optional[Drift] = None  # rank 0: the start (θ_0) on the host, for drift/* at evaluations

    @classmethod
    def build(cls, config: Dict[str, Any]) -> "Worker":
        """The worker Ray Train runs: its rank, world size and device from Ray Train's context, the model under
        `ray.train.torch.prepare_model` (DDP when world > 1)."""
        cfg = typed_config(config["cfg"])
        _quiet_ray_train(cfg.trainer.ray_log_level)
        ctx = ray.train.get_context()
        ddp_kwargs = {"find_unused_parameters": cfg.trainer.find_unused_parameters}
        return cls.assemble(cfg, config["run"], ctx.get_world_rank(), ctx.get_world_size(),
                            ray.train.torch.get_device(),
                            lambda m: ray.train.torch.prepare_model(m, parallel_strategy_kwargs=ddp_kwargs))

    @classmethod
    def assemble(cls, cfg: DictConfig, run: Dict[str, Any], rank: int, world: int, device: torch.device,
                 prepare: Callable[[torch.nn.Module], torch.nn.Module]) -> "Worker":
        """The worker of `rank` in `world` on `device`; `prepare` puts the model on the device (and under DDP).
        Without Ray, a test builds rank 0 of one worker this way."""
        tcfg = cfg.trainer
        torch.set_num_threads(max(1, int(tcfg.cpus_per_worker)))
        seed_everything(tcfg.seed)
        total = int(run["total_steps"])

        scenario = build_scenario(fetched(cfg.scenario), cfg.stream, seed=tcfg.seed)  # a models:/ start: local
        scenario.set_total_steps(total)  # schedules inside the scenario (DoRA's teacher momentum)
        # uint8 until the device, copied ahead of the step (pinned memory and a side stream on CUDA)
        stream = DeviceStream(build_stream(cfg.data, cfg.stream, rank=rank, world_size=world), device)
        if compile_wanted(tcfg.compile, device):  # trainer.compile: the ViT blocks, in place, before DDP wraps them
            compile_blocks(scenario.model)
        model = prepare(scenario.model)
        net = unwrap(model)
        groups = param_groups(net, cfg.optimizer)
        params = [p for group in groups for p in group["params"]]
        optimizer = build_optimizer(groups, cfg.optimizer, diagnostics=True, total_steps=total)
        drift = Drift.of(params, scenario.drift_modules(net)) if rank == 0 else None  # before any restore
        # Optimizers with their own diagnostics (the orthogonal and slower ones) compute grad_cos_prev inside their
        # step, on every rank; for plain torch ones rank 0 tracks it.
        cosines = optimizer if hasattr(optimizer, "diagnostics") else (
            GradCosineTracker(params) if rank == 0 else None)
        return cls(cfg=cfg, run=run, total=total, rank=rank, world=world, device=device, scenario=scenario,
                   stream=stream, model=model, net=net, params=params, optimizer=optimizer,
                   schedules=Schedules(cfg.optimizer, total), cosines=cosines,
                   autocast=autocast_for(tcfg, device), drift=drift)
