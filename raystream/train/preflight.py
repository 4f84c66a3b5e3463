"""Checks made on the driver before any worker starts, each failing with a ConfigError that names the key.

- the composed config's own checks (`raystream.config.check`: ranges, batch size divisible by workers), again,
  because Tune hands `fit` configs it changed;
- the Ray cluster has the CPUs and GPUs the workers ask for (`trainer.num_workers` x `trainer.cpus_per_worker`,
  one GPU per worker with `trainer.use_gpu`). Clusters that autoscale can skip this with RAYSTREAM_NO_RESOURCE_CHECK=1;
- the videos open and fill at least one global batch (`build_stream` probes them all; demo videos are generated
  here, once, instead of by every worker at the same time), which also gives the number of steps.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from raystream.config import ConfigError, check


def check_resources(trainer_cfg, resources: Mapping[str, float]) -> None:
    """`resources`: the cluster's total resources (`ray.cluster_resources()`)."""
    if os.environ.get("RAYSTREAM_NO_RESOURCE_CHECK") == "1":
        return
    workers, cpus = int(trainer_cfg.num_workers), float(trainer_cfg.cpus_per_worker)
    have_cpu = float(resources.get("CPU", 0))
    if workers * cpus > have_cpu:
        raise ConfigError(
            f"config key `trainer.num_workers` = {workers} (x `trainer.cpus_per_worker` = {cpus:g}) needs "
            f"{workers * cpus:g} CPUs but the Ray cluster has {have_cpu:g}: lower trainer.num_workers or "
            "trainer.cpus_per_worker, or add nodes")
    if bool(trainer_cfg.use_gpu):
        have_gpu = float(resources.get("GPU", 0))
        if workers > have_gpu:
            raise ConfigError(
                f"config key `trainer.use_gpu` = true with `trainer.num_workers` = {workers} needs {workers} GPUs "
                f"but the Ray cluster has {have_gpu:g}: set trainer.use_gpu=false or fewer workers")


def total_steps(cfg) -> int:
    """Steps this run trains: `trainer.max_steps` capped at the stream's global steps. Opens every video once."""
    from raystream.data import build_stream

    stream = build_stream(cfg.data, cfg.stream, rank=0, world_size=int(cfg.trainer.num_workers))
    try:
        available = int(stream.num_steps)
    finally:
        stream.close()
    wanted: Optional[int] = cfg.trainer.max_steps
    return available if wanted is None else min(int(wanted), available)

