"""The files of a run's LoggedModel: an MLflow PyTorch model directory made from a checkpoint's files.

tracking/logged_model.py records a `model` event as a LoggedModel and uploads a directory of files for it; how
that directory is made needs the models package (`models/saved.py`'s `Saved`, which MLflow pickles as
`rebuild(config, state)`), which tracking does not import. This module makes it, and `install()` (run when
raystream.train is imported; `raystream tracking upload` calls it too) hands `write_model` to tracking.
The model is written from the checkpoint's files (`model.pt` read as tensors, `mmap`): no process builds the model.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Dict, List

from raystream.tracking import logged_model


def install() -> None:
    """Tracking writes LoggedModel files with `write_model`."""
    logged_model.write_models_with(write_model)


def write_model(event: Dict[str, Any], path: str) -> None:
    """The MLflow PyTorch model directory of the event's checkpoint at `path` (MLflow's own `save_model`), with the
    checkpoint's meta.json and the run's config beside it under `raystream/`."""
    import mlflow.pytorch  # lazy: MLflow's PyTorch flavour (torch), only when a model is written
    import torch  # lazy: as above
    import yaml  # lazy: as above

    from raystream.models.saved import Saved  # lazy: the models package (torch), only when a model is written
    from raystream.uris import download, filesystem_at  # lazy: pyarrow, as above

    with tempfile.TemporaryDirectory(prefix="raystream-checkpoint-") as d:
        fs, where = filesystem_at(event["checkpoint"].rstrip("/"))
        for name in ("model.pt", "meta.json"):
            download(fs, f"{where}/{name}", os.path.join(d, name))
        state = torch.load(os.path.join(d, "model.pt"), map_location="cpu", weights_only=True, mmap=True)
        quiet = logging.getLogger("mlflow.pytorch")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # MLflow's note on pickles: this one unpickles to raystream's own builder
        try:
            mlflow.pytorch.save_model(Saved(event["config"], state), path, serialization_format="pickle",
                                      pip_requirements=_requirements(), metadata={"raystream_step": event["step"]})
        finally:
            quiet.setLevel(level)
        extra = os.path.join(path, "raystream")
        os.makedirs(extra)
        os.replace(os.path.join(d, "meta.json"), os.path.join(extra, "meta.json"))
    with open(os.path.join(extra, "config.yaml"), "w") as f:
        yaml.safe_dump(event["config"], f, sort_keys=False)
    with open(os.path.join(extra, "metrics.json"), "w") as f:
        json.dump(event["metrics"], f, indent=1)


def _requirements() -> List[str]:
    from importlib.metadata import PackageNotFoundError, version  # lazy: only when a model is written

    import torch  # lazy: as above

    out = [f"torch=={torch.__version__.split('+')[0]}"]
    try:
        out.append(f"raystream=={version('raystream')}")
    except PackageNotFoundError:
        out.append("raystream")
    return out
