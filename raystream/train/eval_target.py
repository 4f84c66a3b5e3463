"""What `raystream eval <target>` evaluates, resolved on the driver before Ray starts.

The target is a training run's directory (`<trainer.storage_path>/<run name>`: its newest complete checkpoint), one
checkpoint directory of it (`checkpoint_<step>`), or either of them in a bucket (`s3://...`, `gs://...`). What the
run recorded tells where the results go: the MLflow run id in the run directory's `raystream_run.json` (or the
checkpoint's meta.json). Anything that cannot be evaluated fails here with a ConfigError naming the target and
what was expected: a path or URI that cannot be opened, a directory that is neither a run nor a checkpoint, a run
directory without a complete checkpoint, a torn checkpoint (naming its bad file and the run's newest complete
checkpoint to evaluate instead; a run directory's newer torn checkpoints are skipped, said once each).

What the run recorded also gives the config (`run_config`): the resolved config `raystream train` wrote into
`raystream_run.json` when the run started (or, for runs older than that, the `config.yaml` its record
`events.jsonl` holds at the run's end), with the command's overrides on top, so the model is the one trained
without retyping the training overrides.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pyarrow.fs as pafs
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raystream.config import ConfigError, RunConfig, check, compose, flatten
from raystream.models.checkpoint import is_model_uri
from raystream.tracking import events, names
from raystream.tracking.registry import ModelUriError
from raystream.train import checkpoint as ckpt_files
from raystream.train.model_uri import as_run_dir
from raystream.train.run import RUN_INFO_FILE
from raystream.uris import UriError, filesystem_at, first_line, is_uri, read_file, uri_of

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


def _read_text(fs, path: str) -> Optional[str]:
    try:
        data = read_file(fs, path)
        return None if data is None else data.decode()
    except (OSError, ValueError):
        return None


def _read_json(fs, path: str) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(_read_text(fs, path) or "null")
    except ValueError:
        return None


def _complete(fs, run_path: str) -> Tuple[Optional[Tuple[str, Dict[str, Any]]], List[Tuple[str, str]]]:
    """((path, meta) of the newest complete checkpoint of run directory `run_path`, or None), and the (path,
    problem) of each torn checkpoint newer than it."""
    torn = []
    for path, _ in sorted(ckpt_files.checkpoint_dirs(fs, run_path).items(), key=lambda item: -item[1]):
        meta, problem = ckpt_files._meta_or_problem(fs, path)
        if meta is not None:
            return (path, meta), torn
        torn.append((path, problem))
    return None, torn


def instead(fs, run_path: str, bad: str, scheme: Optional[str]) -> str:
    """What to evaluate instead of the bad checkpoint `bad`: the run's newest complete other checkpoint, or that
    the run has none."""
    for path, _ in sorted(ckpt_files.checkpoint_dirs(fs, run_path).items(), key=lambda item: -item[1]):
        if path != bad and ckpt_files._complete_meta(fs, path) is not None:
            return f"evaluate {_join('', path, scheme)} instead (the run's newest complete checkpoint)"
    return f"the run {_join('', run_path, scheme)} has no other complete checkpoint to evaluate"


def resolve(target: str) -> EvalTarget:
    """The checkpoint `target` names (module docstring); ConfigError when there is none to evaluate. A LoggedModel
    (`models:/<model_id>`, `models:/<name>@<alias>`, at $MLFLOW_TRACKING_URI) is evaluated as the run directory
    `train.model_uri.as_run_dir` makes of it in the node's cache, its metrics going to the run that logged it."""
    text = str(target).strip()
    if is_model_uri(text):
        try:
            text = as_run_dir(text)
        except ModelUriError as exc:
            raise ConfigError(f"target {target!r}: {exc}") from None
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
        run_path = path.rsplit("/", 1)[0]
        if meta is None:
            raise ConfigError(f"target {target!r}: the checkpoint {_join(text, path, scheme)} is incomplete (torn): "
                              f"{problem}; {instead(fs, run_path, path, scheme)}")
        ckpt_path = path
    else:
        found, torn = _complete(fs, path)
        if found is None and torn:
            raise ConfigError(f"target {target!r}: every checkpoint of the run is incomplete (torn): "
                              + "; ".join(f"{_join(text, p, scheme)}: {why}" for p, why in torn)
                              + ". There is no checkpoint of it to evaluate")
        if found is None:
            raise ConfigError(f"target {target!r}: no checkpoint in it (no complete checkpoint_<step> "
                              f"directory); expected {EXPECTED}")
        ckpt_path, meta = found
        for bad, why in torn:
            print(f"raystream eval: WARNING: skipping the incomplete (torn) checkpoint {_join(text, bad, scheme)} "
                  f"({why}); evaluating {_join(text, ckpt_path, scheme)}, the run's newest complete one",
                  file=sys.stderr, flush=True)
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


def recorded_config(run_dir: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """(the resolved config the training run in `run_dir` recorded, where): `config` in its raystream_run.json
    (written when the run starts), else the last `config.yaml` its record holds (written at the run's end);
    (None, "") when it recorded neither."""
    fs, path = filesystem_at(run_dir)
    info = _read_json(fs, f"{path}/{RUN_INFO_FILE}") or {}
    if isinstance(info.get("config"), dict):
        return info["config"], f"{run_dir}/{RUN_INFO_FILE}"
    found = None
    for line in (_read_text(fs, f"{path}/{events.FILE_NAME}") or "").splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # a torn line: the others still count
            continue
        if isinstance(event, dict) and event.get("kind") == "text" and event.get("name") == names.ARTIFACT_CONFIG:
            found = event.get("content")
    if not isinstance(found, str):
        return None, ""
    return OmegaConf.to_container(OmegaConf.create(found)), f"{run_dir}/{events.FILE_NAME}"


def override_keys(overrides: Sequence[str]) -> List[str]:
    """The dotted keys (or group names) `overrides` set."""
    return [o.split("=", 1)[0].lstrip("+~").strip() for o in overrides if "=" in o]


def run_config(target: EvalTarget, overrides: Sequence[str]) -> Tuple[DictConfig, str]:
    """(the config `raystream eval` evaluates `target` under, the one line saying what it is): the training run's
    recorded config with what `overrides` set on top (each key the overrides change from the defaults, and each
    key they name); the defaults with `overrides` when the run recorded no config. An `eval.protocol` that differs
    from the run's brings that protocol's own probes (`protocol_probes`) unless the overrides name `eval.metrics`
    (or the `eval` group), said on the line. ConfigError when the recorded config does not fit this raystream's
    schema, or the result fails its checks."""
    given = compose(overrides)
    shown = " ".join(overrides) or "no overrides"
    recorded, where = recorded_config(target.run_dir)
    defaults, named = compose([]), override_keys(overrides)
    if recorded is None:
        cfg, before = given, defaults.eval
        line = (f"raystream eval: run {target.run_name} recorded no config (in {RUN_INFO_FILE} or its record): the "
                f"defaults with {shown}")
    else:
        try:
            cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), recorded)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"the config run {target.run_name} recorded in {where} does not fit this raystream "
                              f"({first_line(exc)}): give the training run's overrides with eval.* ones") from None
        before = copy.deepcopy(cfg.eval)
        flat_defaults = flatten(defaults)
        for key, value in flatten(given).items():
            if flat_defaults.get(key, ...) != value or any(key == n or key.startswith(f"{n}.") for n in named):
                OmegaConf.update(cfg, key, value, merge=False)
        line = f"raystream eval: the config of run {target.run_name} (recorded in {where}) with {shown} on top"
    switched = _protocol_switched(cfg, before, named)
    check(cfg)
    return cfg, line + switched


def protocol_probes(protocol: str) -> List[str]:
    """The probes evaluation protocol `protocol` runs: those of its config group, sweeps/eval/<protocol>.yaml
    (dino: kNN and the linear probe; vjepa: the linear and the attentive probe; default: kNN and the linear probe)."""
    return list(compose([f"eval={protocol}"]).eval.metrics)


def _protocol_switched(cfg: DictConfig, before: DictConfig, named: Sequence[str]) -> str:
    """When the command's overrides switch `eval.protocol` from the run's (`before`: the run's eval config) and name
    neither `eval.metrics` nor the `eval` group: set `cfg.eval.metrics` to the new protocol's probes (a VideoMAE
    run trained with kNN and the linear probe, evaluated with eval.protocol=vjepa, gets V-JEPA's attentive probe);
    the words that say so on the command's line, else ""."""
    protocol = str(cfg.eval.protocol)
    if "eval.protocol" not in named or protocol == str(before.protocol) or {"eval", "eval.metrics"} & set(named):
        return ""
    probes = protocol_probes(protocol)
    cfg.eval.metrics = probes
    return (f"; eval.protocol={protocol} brings its own probes: eval.metrics=[{', '.join(probes)}] (the run's were "
            f"[{', '.join(map(str, before.metrics))}]; set eval.metrics to choose)")
