"""A run resolved once: what the driver's steps (train/run.py) take instead of a dozen loose arguments.

    run = resolve(cfg, RunOptions(...), run_name=..., parent_run_id=..., tags=...)   # checks, before Ray starts

`resolve` names the run, checks its config and inputs (the start checkpoint, the local CPUs, Triton's device), has
data/ resolve its videos (training, held-out, probe: data/named.py's rule, once) and probe the stream (the run's
steps, the videos `data.on_bad_video=skip` left out, the probed videos its MLflow dataset input digests), and
places the run directory in its storage. The MLflow ids are set when the run is opened (`Run.opened`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig

from raystream.config import check
from raystream.data.named import NamedVideos, heldout_videos, training_videos
from raystream.tracking import events
from raystream.tracking.store import tracking_uri
from raystream.train import storage as results
from raystream.train.preflight import (check_backbone_init, check_local_cpus, check_triton_device, scenario_needs,
                                       stream_plan)


@dataclass
class RunOptions:
    """What a caller of `fit` may add. `init_checked`: the line `check_backbone_init` gave for this config earlier
    (a sweep checks each distinct model's start once; None: checked here). `step_hooks`: faults a test injects from
    outside the step (`raystream.train.faults.Faults`). `register`: {name, alias}: the final checkpoint becomes a
    version of that registered MLflow model, with the alias (`raystream pretrain-start`)."""

    init_checked: Optional[str] = None
    step_hooks: Optional[Any] = None
    register: Optional[Dict[str, str]] = None


@dataclass
class RunVideos:
    """The run's videos, resolved once by data/: `training` and `heldout` (None: own videos without held-out ones),
    `probe` (`eval.dataset`, or None), and `probed`: the stream's probed videos (`VideoInfo`), which the training
    dataset input digests."""

    training: NamedVideos
    heldout: Optional[NamedVideos]
    probe: Optional[str]
    probed: List[Any] = field(default_factory=list)


@dataclass
class Run:
    """One run as the driver resolved it: its config (with its name), name, storage and run directory, videos, the
    stream's steps and skipped videos, the start checkpoint's line, what the caller gave (options, callbacks, a
    sweep's parent run and tags) and, once opened, its MLflow ids and record."""

    cfg: DictConfig
    name: str
    storage: "results.Storage"
    run_dir: "results.Storage"
    videos: RunVideos
    total_steps: int
    skipped: List[Tuple[str, str]]
    init_line: Optional[str]
    options: RunOptions
    callbacks: Sequence[Any] = ()
    parent_run_id: Optional[str] = None  # a sweep's trial: its sweep's MLflow parent run
    tags: Dict[str, str] = field(default_factory=dict)
    tracking_uri: str = ""
    run_id: str = ""  # the MLflow run, once opened
    info: Dict[str, Any] = field(default_factory=dict)  # the run file an earlier attempt wrote ({} when fresh)

    @property
    def record(self) -> str:
        """The run's record (`<run dir>/events.jsonl`): what it writes to MLflow, mirrored from there."""
        return events.path_in(self.run_dir.uri)

    @property
    def is_trial(self) -> bool:
        return self.parent_run_id is not None

    @property
    def log_model(self) -> bool:
        """`trainer.log_checkpoint_artifact`, whose null means: a single run logs its models, a sweep's trial not."""
        value = self.cfg.trainer.log_checkpoint_artifact
        return not self.is_trial if value is None else bool(value)

    def opened(self, run_id: str, info: Dict[str, Any]) -> None:
        """The MLflow run this run writes to (`info`: the run file of an earlier attempt, or {})."""
        self.run_id, self.info = run_id, dict(info)


def videos_of(cfg) -> RunVideos:
    """The run's videos as data/ resolves them (data/named.py); the demo's held-out videos only when the scenario
    evaluates on them (else they are not made)."""
    needs_heldout = "heldout" in scenario_needs(str(cfg.scenario.name))
    return RunVideos(training_videos(cfg.data), heldout_videos(cfg.data, demo=needs_heldout),
                     None if cfg.eval.dataset is None else str(cfg.eval.dataset))


def default_run_name(cfg) -> str:
    return (f"{cfg.scenario.name}-{cfg.optimizer.name}-{cfg.stream.order}-"
            f"{time.strftime('%Y%m%d-%H%M%S')}")


def resolve(cfg: DictConfig, options: RunOptions, *, run_name: Optional[str] = None,
            parent_run_id: Optional[str] = None, tags: Optional[Dict[str, str]] = None) -> Run:
    """The run `cfg` describes, checked before Ray starts: a bad input writes nothing (no run directory, no lock).
    ConfigError / DataError name the key, file or value."""
    cfg = copy.deepcopy(cfg)
    name = run_name or cfg.trainer.run_name or default_run_name(cfg)
    cfg.trainer.run_name = name
    check(cfg)
    storage = results.resolve(cfg.trainer.storage_path)  # local directory or s3:// / gs:// URI
    init_line = options.init_checked if options.init_checked is not None else check_backbone_init(cfg)
    check_local_cpus(cfg.trainer)
    check_triton_device(cfg)
    videos = videos_of(cfg)
    steps, skipped = stream_plan(cfg, videos.probed)
    return Run(cfg, name, storage, storage.child(name), videos, steps, skipped, init_line, options,
               parent_run_id=parent_run_id, tags=dict(tags or {}), tracking_uri=tracking_uri(cfg))
