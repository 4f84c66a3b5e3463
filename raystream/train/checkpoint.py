"""What a training checkpoint holds, and writing / reading it (one directory, written by rank 0).

    model.pt          the scenario model's state dict (no DDP prefix): what `scenario.backbone.init=<dir>` reads
    train_state.pt    optimizer (the orthogonal EMA included), lr scheduler, gradient-cosine tracker, RNG states,
                      running sums of the in-stream metrics, evaluation results so far
    meta.json         next_step, total_steps, the stream's state_dict, the MLflow run id, world size, finished

Everything is tensors and plain containers, so it loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

MODEL_FILE = "model.pt"
STATE_FILE = "train_state.pt"
META_FILE = "meta.json"


def dir_name(next_step: int) -> str:
    """`checkpoint_00000120`: zero-padded so the latest sorts last."""
    return f"checkpoint_{next_step:08d}"


def rng_state() -> Dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: Path, *, model_state: Dict[str, torch.Tensor], train_state: Dict[str, Any],
         meta: Dict[str, Any]) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(model_state, directory / MODEL_FILE)
    torch.save({**train_state, "rng": rng_state()}, directory / STATE_FILE)
    (directory / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
    return directory


def load(directory: Path, map_location: Optional[torch.device] = None
         ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any], Dict[str, Any]]:
    """(model state dict, train state, meta) of a checkpoint directory."""
    directory = Path(directory)
    missing = [f for f in (MODEL_FILE, STATE_FILE, META_FILE) if not (directory / f).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {directory} lacks {', '.join(missing)}")
    model_state = torch.load(directory / MODEL_FILE, map_location=map_location or "cpu", weights_only=True)
    train_state = torch.load(directory / STATE_FILE, map_location=map_location or "cpu", weights_only=True)
    meta = json.loads((directory / META_FILE).read_text())
    return model_state, train_state, meta
