"""Checks made on the driver before any worker starts, each failing with a ConfigError that names the key.

- `raystream train`'s inputs, all checked together and reported together (`check_inputs`): the MLflow tracking
  store, the videos listed (`data.videos`, `data.heldout_videos`), the evaluation data the scenario needs and the
  probe set listed (`eval.dataset`), the start checkpoint (`scenario.backbone.init`);
- `optimizer.triton: true` only on GPU workers (`check_triton_device`);
- the composed config's own checks (`raystream.config.check`: ranges, batch size divisible by workers), again,
  because Tune hands `fit` configs it changed;
- a run on its own videos has the evaluation data its scenario needs (`eval.dataset` for probes,
  `data.heldout_videos` for held-out pixel error): otherwise it would fail only after all the training;
- the Ray cluster has the CPUs and GPUs the workers ask for (`trainer.num_workers` x `trainer.cpus_per_worker`,
  one GPU per worker with `trainer.use_gpu`). Clusters that autoscale can skip this with RAYSTREAM_NO_RESOURCE_CHECK=1.
  A local run (no `RAY_ADDRESS`) checks the CPUs against this machine's before Ray starts (`check_local_cpus`);
- `scenario.backbone.init` names a checkpoint that fits the model (`check_backbone_init`: read and translated, checked
  against a model built on the meta device), and the line saying what it will load is printed;
- the videos open and fill at least one global batch (`build_stream` probes them all; demo videos are generated
  here, once, instead of by every worker at the same time), which also gives the number of steps.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from raystream.config import ConfigError
from raystream.data import DataError, build_stream
from raystream.data.named import given_videos, heldout_videos, uses_demo
from raystream.data.videos.listing import resolve_videos
from raystream.models.checkpoint import CheckpointError, is_model_uri
from raystream.models.scenario import Scenario, check_init
from raystream.train.model_uri import fetched
from raystream.uris import is_uri


def check_inputs(cfg) -> None:
    """Every input of a run that can be checked before Ray starts, checked together: one ConfigError listing each
    problem (the tracking store, the videos, the evaluation data, the probe set, the start checkpoint), so that
    one bad input does not hide another. A new sqlite tracking store is created here (`prepare_store`)."""
    raise_together(list(input_problems(cfg).values()), "the run's inputs")


def input_problems(cfg, store: bool = True) -> Dict[str, str]:
    """What is wrong with a run's inputs (`check_inputs`' list; the tracking store only with `store`): the key of
    each bad input -> its problem, one message; empty when all are fine."""
    from raystream.eval.loaders import check_probe_set  # lazy: the probes' loaders (PIL, decoders)
    from raystream.tracking.store import TrackingStoreError, prepare_store, tracking_uri  # lazy: MLflow

    checks = {"data.videos": lambda: _check_videos(cfg, "data.videos"),
              "data.heldout_videos": lambda: _check_videos(cfg, "data.heldout_videos"),
              "evaluation data": lambda: check_evaluation_data(cfg),
              "eval.dataset": lambda: cfg.eval.dataset is None or check_probe_set(str(cfg.eval.dataset)),
              "scenario.backbone.init": lambda: check_backbone_init(cfg, say=False),
              "optimizer.triton": lambda: check_triton_device(cfg)}  # again in fit: Tune's cells call fit
    if store:
        checks = {"mlflow.tracking_uri": lambda: prepare_store(tracking_uri(cfg)), **checks}
    problems = {}
    for key, run_check in checks.items():
        try:
            run_check()
        except (ConfigError, DataError, TrackingStoreError) as exc:
            problems[key] = str(exc)
    return problems


def check_triton_device(cfg) -> None:
    """`optimizer.triton: true` asks for the fused Triton step, which runs on CUDA: a run on CPU workers is refused
    here rather than by every worker's optimizer (`raystream bench` picks its device with --device instead)."""
    if cfg.optimizer.triton is True and not cfg.trainer.use_gpu:
        raise ConfigError("config key `optimizer.triton` = True: expected false or auto with trainer.use_gpu=false "
                          "(the fused Triton step runs on CUDA; set trainer.use_gpu=true on a GPU cluster)")


def raise_together(problems: List[str], what: str) -> None:
    """One ConfigError for all `problems` (`what` they are problems with), nothing when there are none."""
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems with {what} (nothing ran):\n"
                          + "\n".join(f"  - {p}" for p in problems))


def _check_videos(cfg, key: str) -> None:
    """The videos `key` names are listed and, on this node, there (unless `data.on_bad_video=skip` may leave
    missing ones out); opening them is `stream_plan`'s."""
    given = {videos.key: videos for videos in given_videos(cfg.data)}  # the demo's are made, not checked
    if key not in given:
        return
    entries = resolve_videos(given[key].spec, key)
    missing = [e.path for e in entries if not is_uri(e.path) and not os.path.isfile(e.path)]
    if missing and (str(cfg.data.on_bad_video) != "skip" or len(missing) == len(entries)):
        raise DataError(f"`{key}`: {len(missing)} of {len(entries)} videos not found: "
                        + ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else ""))


def check_evaluation_data(cfg) -> None:
    """A run on its own videos (`data.videos` set) has no demo probe or held-out set: the scenario's evaluation
    needs `eval.dataset` (probes) or `data.heldout_videos` (held-out pixel error), known here and not after training."""
    if uses_demo(cfg.data):
        return
    needs = scenario_needs(str(cfg.scenario.name))
    if "probe" in needs and cfg.eval.dataset is None:
        raise ConfigError(
            f"config key `eval.dataset` = None with your own videos (`data.videos` = {cfg.data.videos!r}): scenario "
            f"`{cfg.scenario.name}` is evaluated by probes, which need a labelled set: a folder of class "
            "sub-folders, or a CSV manifest with path,label")
    if "heldout" in needs and heldout_videos(cfg.data, demo=False) is None:
        raise ConfigError(
            f"config key `data.heldout_videos` = None with your own videos (`data.videos` = {cfg.data.videos!r}): "
            f"scenario `{cfg.scenario.name}` is evaluated out of stream, on held-out videos (a list, directory or "
            "manifest)")


def check_backbone_init(cfg, say: bool = True) -> Optional[str]:
    """A checkpoint in `scenario.backbone.init` is read, translated and checked against the model on the meta
    device, before Ray starts; its one line goes to stderr (`say`) and is returned (None for random weights). A
    CheckpointError becomes a ConfigError."""
    if str(cfg.scenario.backbone.init) in ("", "random"):
        return None
    if is_model_uri(cfg.scenario.backbone.init):  # fetched from the run's own tracking server
        from raystream.tracking import registry  # lazy: MLflow
        from raystream.tracking.store import tracking_uri  # lazy: as above

        registry.use(tracking_uri(cfg))
    try:
        line = check_init(fetched(cfg.scenario), cfg.stream, int(cfg.trainer.seed))
    except CheckpointError as exc:
        start = Path(os.path.expanduser(str(cfg.scenario.backbone.init)))
        hint = ""
        if start.parent.name == "starts" and not start.exists():
            hint = " (a start made here: make it first with `raystream pretrain-start`, docs/results.md)"
        raise ConfigError(f"{exc}{hint}") from None
    if say:
        print(f"raystream: {line}", file=sys.stderr, flush=True)
    return line


def scenario_needs(name: str) -> frozenset:
    """What evaluating scenario `name` needs (`Scenario.needs`: probe, heldout), read from its class."""
    try:
        importlib.import_module(f"raystream.models.{name}")
    except ModuleNotFoundError:
        return frozenset()  # unknown names are reported by the scenario's own check

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    return frozenset().union(*(c.needs for c in subclasses(Scenario) if c.name == name))


def machine_cpus() -> int:
    """The CPUs this process may use (its affinity mask), what a local Ray cluster offers at most."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_local_cpus(trainer_cfg) -> None:
    """A local run (no `RAY_ADDRESS`, Ray not started yet): the workers' CPUs against this machine's, before the
    seconds Ray takes to start. A cluster is checked after joining it (`check_resources`)."""
    ray = sys.modules.get("ray")
    if os.environ.get("RAY_ADDRESS") or (ray is not None and ray.is_initialized()):
        return
    check_resources(trainer_cfg, {"CPU": float(machine_cpus())}, where="this machine (local Ray)")


def check_resources(trainer_cfg, resources: Mapping[str, float], where: str = "the Ray cluster") -> None:
    """`resources`: the cluster's total resources (`ray.cluster_resources()`)."""
    if os.environ.get("RAYSTREAM_NO_RESOURCE_CHECK") == "1":
        return
    workers, cpus = int(trainer_cfg.num_workers), float(trainer_cfg.cpus_per_worker)
    have_cpu = float(resources.get("CPU", 0))
    if workers * cpus > have_cpu:
        raise ConfigError(
            f"config key `trainer.num_workers` = {workers} (x `trainer.cpus_per_worker` = {cpus:g}) needs "
            f"{workers * cpus:g} CPUs but {where} has {have_cpu:g}: lower trainer.num_workers or "
            "trainer.cpus_per_worker, or add nodes")
    if bool(trainer_cfg.use_gpu):
        have_gpu = float(resources.get("GPU", 0))
        if workers > have_gpu:
            raise ConfigError(
                f"config key `trainer.use_gpu` = true with `trainer.num_workers` = {workers} needs {workers} GPUs "
                f"but the Ray cluster has {have_gpu:g}: set trainer.use_gpu=false or fewer workers")


def total_steps(cfg) -> int:
    """Steps this run trains: `trainer.max_steps` capped at the stream's global steps. Opens every video once."""
    return stream_plan(cfg)[0]


def stream_plan(cfg, videos: Optional[list] = None) -> Tuple[int, List[Tuple[str, str]]]:
    """(`total_steps(cfg)`, the (video, reason) pairs `data.on_bad_video=skip` leaves out); the stream's probed
    videos (`VideoInfo`: what the run's MLflow dataset input digests) are appended to `videos` when given."""
    stream = build_stream(cfg.data, cfg.stream, rank=0, world_size=int(cfg.trainer.num_workers))
    try:
        if videos is not None:
            videos.extend(stream.videos)
        available = int(stream.num_steps)
        skipped = [(str(path), str(reason)) for path, reason in getattr(stream, "skipped", [])]
    finally:
        stream.close()
    wanted: Optional[int] = cfg.trainer.max_steps
    if wanted is not None and int(wanted) > available:
        print(f"raystream: trainer.max_steps = {wanted} but the stream has {available} global steps "
              f"({stream_summary(cfg)}): the run trains {available} steps", file=sys.stderr, flush=True)
    return (available if wanted is None else min(int(wanted), available)), skipped


def stream_summary(cfg) -> str:
    """`stream.order = ..., stream.batch_size = ..., stream.epochs = ...`: what sets a stream's number of steps."""
    return (f"stream.order = {cfg.stream.order}, stream.batch_size = {cfg.stream.batch_size}, "
            f"stream.epochs = {cfg.stream.epochs}")

