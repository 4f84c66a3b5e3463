"""Initialise a scenario's model from a local state dict or from an earlier raystream run. No downloads.

`scenario.backbone.init` is one of:
- `random`: keep the seeded random initialisation;
- a `.safetensors` file (read with safetensors) or any other file (`torch.load(weights_only=True)`: tensors and
  plain containers only, never arbitrary pickled objects);
- a directory: a Ray checkpoint holding `model.pt` / `model.safetensors` (what the train loop saves), or a run
  directory holding such checkpoints (the latest `checkpoint_*` is used). A `run:` prefix is accepted and ignored;
- an MLflow model URI (`models:/<model_id>`, `models:/<name>@<alias>`, `models:/<name>/<version>`) is fetched by
  the train layer (raystream/train/model_uri.py), which hands this module the local file: this module reaches no
  server.

The state dict may be the whole scenario model (restored exactly) or just a backbone: keys `encoder.*` of a
scenario checkpoint, or a published ViT in its authors' layout (DINO/DoRA, timm, transformers, official VideoMAE;
translated by published.py). `module.` (DDP) and `_orig_mod.` (torch.compile) prefixes are stripped;
`{"model": state_dict}` / `{"state_dict": ...}` wrappers are unwrapped; of a DINO/DoRA training checkpoint
(`{"student": ..., "teacher": ..., "args": Namespace, ...}`) the network `scenario.backbone.init_from` names is taken
(the teacher by default, as DINO evaluates it). Only tensors, plain containers and argparse.Namespace (DINO's and
VideoMAE's `args`) are unpickled; a raystream model MLflow holds (`models/saved.py`) is read as its state dict. Anything else fails with a CheckpointError naming the file and what was expected.

`initialise` says in one line what it did (`Loaded.line`: the file, its layout, what was mapped, dropped, inflated);
on a model built on the meta device it checks and says, and loads nothing (the driver's check before Ray starts).
"""

from __future__ import annotations

import argparse
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import torch
from safetensors.torch import load_file
from torch import nn

from raystream.models.published import LayoutError, Translation, fit_to, fitting_shape, to_vit_keys

log = logging.getLogger(__name__)

MODEL_FILES = ("model.pt", "model.safetensors")
_WRAPPERS = ("model", "state_dict", "model_state_dict", "module")
_PREFIXES = ("module.", "_orig_mod.")


SAVED_MODEL_GLOBAL = "raystream.models.saved.rebuild"  # how models/saved.py's file names its builder


def _saved_state(config, state):
    """`rebuild(config, state)` of a saved model (models/saved.py), read as its state dict: nothing is built."""
    return state


class CheckpointError(ValueError):
    """A checkpoint cannot be found, read or applied; the message names the file."""


def is_model_uri(init: Union[str, Path, None]) -> bool:
    """`init` is an MLflow model URI (`models:/...`), resolved through MLflow, not a path."""
    return str(init).startswith("models:/")


def resolve_checkpoint(init: Union[str, Path]) -> Path:
    """The state-dict file that `init` (a file, a checkpoint directory or a run directory) names."""
    if is_model_uri(init):
        raise CheckpointError(f"scenario.backbone.init = {str(init)!r}: an MLflow model URI is fetched by the train "
                              "layer (raystream.train.model_uri.fetched) before the model is built; the models "
                              "package reads local files only")
    path = Path(str(init).removeprefix("run:")).expanduser()
    if not path.exists():
        raise CheckpointError(f"scenario.backbone.init = {str(init)!r}: no such file or directory")
    if path.is_file():
        return path
    for name in MODEL_FILES:
        if (path / name).is_file():
            return path / name
    found = sorted(p for name in MODEL_FILES for p in path.rglob(name))
    if not found:
        raise CheckpointError(f"scenario.backbone.init = {str(init)!r}: directory holds no {' or '.join(MODEL_FILES)} "
                              "(expected a raystream checkpoint or run directory)")
    runs = sorted({p.parent.parent for p in found})
    if len(runs) > 1:
        raise CheckpointError(f"scenario.backbone.init = {str(init)!r}: checkpoints of {len(runs)} runs found "
                              f"({', '.join(str(r) for r in runs[:4])}); name one checkpoint directory")
    return max(found, key=lambda p: p.parent.name)  # checkpoint_000123: zero-padded, latest sorts last


def _strip(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix):], True
    return key


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if "Weights only load failed" in text:
        detail = next((line.strip() for line in text.splitlines() if "Unsupported global" in line), "")
        detail = detail.split(" was not")[0].replace("WeightsUnpickler error: ", "")
        return ("not a file of tensors that torch.load(weights_only=True) accepts: corrupt, truncated or holding "
                "pickled Python objects" + (f" ({detail})" if detail else ""))
    return f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"


def load_state_dict_file(path: Union[str, Path], init_from: str = "teacher") -> Dict[str, torch.Tensor]:
    """Read a state dict from `path` safely (safetensors, or torch.load with weights_only=True)."""
    return read_state_dict(path, init_from)[0]


def read_state_dict(path: Union[str, Path], init_from: str = "teacher") -> Tuple[Dict[str, torch.Tensor], str]:
    """(state dict, which network of a training checkpoint was taken or ''), read safely from `path`."""
    path = Path(path)
    picked = ""
    try:
        if path.suffix == ".safetensors":
            obj = load_file(str(path), device="cpu")
        else:
            # DINO's / VideoMAE's saved `args`; a raystream model in MLflow's flavour, read as its state dict
            with torch.serialization.safe_globals([argparse.Namespace, (_saved_state, SAVED_MODEL_GLOBAL)]):
                obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as exc:  # corrupt file, truncated zip, a pickled object weights_only refuses, ...
        raise CheckpointError(f"cannot read checkpoint {path}: {_reason(exc)}. Expected a state dict saved with "
                              "torch.save(model.state_dict()) or a .safetensors file (raystream never unpickles "
                              "arbitrary objects)") from None
    if isinstance(obj, dict) and isinstance(obj.get("teacher"), dict) and isinstance(obj.get("student"), dict):
        picked = f"the {init_from}"
        obj = obj[init_from]
    for _ in range(2):
        if isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
            inner = next((obj[k] for k in _WRAPPERS if isinstance(obj.get(k), dict)), None)
            if inner is None:
                break
            obj = inner
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"checkpoint {path} holds a {type(obj).__name__}, not a state dict of tensors "
                              "(expected a mapping of parameter names to tensors)")
    return {_strip(str(k)): v for k, v in obj.items()}, picked


@dataclass
class Loaded:
    """What `initialise` did: the file, the keys it held, and the one line that says so."""

    path: Path
    keys: frozenset
    line: str


def _check_fit(module: nn.Module, state: Dict[str, torch.Tensor], path: Path, what: str) -> None:
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    hint = f"; the checkpoint fits {fitting_shape(state)}" if what == "backbone" else ""
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not fit the {what}: missing keys {missing[:5]}"
                              f"{' ...' if len(missing) > 5 else ''}, unexpected keys {unexpected[:5]}"
                              f"{' ...' if len(unexpected) > 5 else ''} (check scenario.backbone.preset/patch_size"
                              f"{hint})")
    bad = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
           for k in own if state[k].shape != own[k].shape]
    if bad:
        raise CheckpointError(f"checkpoint {path} has tensors of the wrong shape for the {what}: {bad[:5]}{hint}")


def _backbone_translation(state: Dict[str, torch.Tensor], encoder: nn.Module, path: Path) -> Translation:
    try:
        return fit_to(to_vit_keys(state), encoder)
    except LayoutError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from None


def initialise(model: nn.Module, init: Optional[str], encoder: Optional[nn.Module] = None,
               init_from: str = "teacher") -> Optional[Loaded]:
    """Apply `init` to `model` (whole-model state dict) or to its `encoder` (a backbone in any layout published.py
    reads). Returns what was done (None for random initialisation); on meta-device parameters nothing is copied."""
    if init is None or str(init) in ("", "random"):
        return None
    path = resolve_checkpoint(init)
    state, picked = read_state_dict(path, init_from)
    encoder = encoder if encoder is not None else getattr(model, "encoder", None)
    if set(state) == set(model.state_dict()) or encoder is None:
        target, what, done = model, "model", Translation(state, "raystream model")
    else:
        target, what, done = encoder, "backbone", _backbone_translation(state, encoder, path)
    _check_fit(target, done.state, path, what)
    line = (f"scenario.backbone.init: {path}: {done.layout}{' (' + picked + ')' if picked else ''}, "
            f"{len(done.state)} tensors into the {what}" + "".join(f"; {n}" for n in done.notes))
    if not any(p.is_meta for p in target.parameters()):
        target.load_state_dict(done.state)
        log.info("%s", line)
    return Loaded(path, frozenset(state), line)
