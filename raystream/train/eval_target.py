"""What `raystream eval <target>` evaluates, resolved on the driver before Ray starts.

The target is a training run's directory (`<trainer.storage_path>/<run name>`: its newest complete checkpoint), one
checkpoint directory of it (`checkpoint_<step>`), or either of them in a bucket (`s3://...`, `gs://...`). What the
run recorded tells where the results go: the MLflow run id in the run directory's `raystream_run.json` (or the
checkpoint's meta.json). Anything that cannot be evaluated fails here with a ConfigError naming the target and
what was expected: a path or URI that cannot be opened, a directory that is neither a run nor a checkpoint, a run
directory without a complete checkpoint, a torn checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional

import pyarrow.fs as pafs
from omegaconf import OmegaConf

from raystream.config import ConfigError
from raystream.train import checkpoint as ckpt_files
from raystream.train.run import RUN_INFO_FILE
from raystream.uris import UriError, filesystem_at, first_line, is_uri, uri_of

FEATURES_DIR = "eval_features"  # beside the checkpoints: features kept for a second evaluation
EXPECTED = ("a training run's directory (<trainer.storage_path>/<run name>), one of its checkpoint_<step> "
            "directories, or either of them as an s3:// or gs:// URI")


@dataclass(frozen=True)
class EvalTarget:
    """One checkpoint to evaluate. `checkpoint`: its directory as a URI or absolute local path (what workers open);
    `run_dir`: the directory holding it; `step`: the last step it trained; `mlflow_run_id` / `tracking_uri`: the
    training run's MLflow run, when the run recorded it; `identity`: what identifies its weights (path, step and
    file sizes)."""

    checkpoint: str
    run_dir: str
    run_name: str
    step: int
    mlflow_run_id: Optional[str]
    tracking_uri: Optional[str]
    identity: str

    @property
    def name(self) -> str:
        return self.checkpoint.rstrip("/").rsplit("/", 1)[-1]


def _join(base: str, fs_path: str, scheme: Optional[str]) -> str:
    return uri_of(scheme, fs_path) if scheme else fs_path


def _read_json(fs, path: str) -> Optional[Dict[str, Any]]:
    try:
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(path) as f:
            return json.loads(f.read().decode())
    except (OSError, ValueError):
        return None


def resolve(target: str) -> EvalTarget:
    """The checkpoint `target` names (module docstring); ConfigError when there is none to evaluate."""
    text = str(target).strip()
    text = text if text.endswith("://") else text.rstrip("/")
    scheme = text.partition("://")[0] if is_uri(text) else None
    try:
        fs, path = filesystem_at(text)
        kind = fs.get_file_info(path).type
    except (UriError, OSError) as exc:
        raise ConfigError(f"target {target!r}: cannot open it ({first_line(exc)}); expected {EXPECTED}") \
            from None
    if kind != pafs.FileType.Directory:
        raise ConfigError(f"target {target!r}: no such directory; expected {EXPECTED}")
    if _read_json(fs, f"{path}/{ckpt_files.META_FILE}") is not None:  # a checkpoint directory
        meta, problem = ckpt_files._meta_or_problem(fs, path)
        if meta is None:
            raise ConfigError(f"target {target!r}: the checkpoint is incomplete ({problem}); evaluate "
                              "another checkpoint of the run, or its run directory (its newest complete one)")
        ckpt_path, run_path = path, path.rsplit("/", 1)[0]
    else:
        try:
            found = ckpt_files.latest(fs, path)
        except ckpt_files.CheckpointError as exc:
            raise ConfigError(f"target {target!r}: {exc}") from None
        if found is None:
            raise ConfigError(f"target {target!r}: no checkpoint in it (no complete checkpoint_<step> "
                              f"directory); expected {EXPECTED}")
        ckpt_path, meta = found
        run_path = path
    info = _read_json(fs, f"{run_path}/{RUN_INFO_FILE}") or {}
    sizes = json.dumps(meta.get("file_sizes", {}), sort_keys=True)
    checkpoint = _join(text, ckpt_path, scheme)
    return EvalTarget(
        checkpoint=checkpoint, run_dir=_join(text, run_path, scheme),
        run_name=str(info.get("run_name") or meta.get("run_name") or run_path.rsplit("/", 1)[-1]),
        step=int(meta["next_step"]) - 1, mlflow_run_id=info.get("mlflow_run_id") or meta.get("mlflow_run_id"),
        tracking_uri=info.get("tracking_uri"),
        identity=hashlib.sha256(f"{checkpoint}|{meta['next_step']}|{sizes}".encode()).hexdigest())


def features_uri(target: EvalTarget, cfg) -> str:
    """Where the probe set's features of `target`'s weights under `cfg`'s protocol are kept: one file in the run
    directory's `eval_features/`, named by the checkpoint and protocol, keyed by everything that changes them
    (the weights, the model, the probe set, its subset and views)."""
    e, s = cfg.eval, cfg.stream
    key = {"weights": target.identity, "scenario": OmegaConf.to_container(cfg.scenario, resolve=True),
           "stream": [s.resolution, s.frames_per_clip, s.fps], "decoder": str(cfg.data.decoder),
           "eval": [e.dataset, e.protocol, e.max_probe_samples, e.seed, e.dino.resize, e.dino.crop,
                    e.vjepa.frames_per_clip, e.vjepa.fps]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{target.run_dir}/{FEATURES_DIR}/{target.name}-{e.protocol}-{digest}.pt"
