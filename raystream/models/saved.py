"""A trained scenario model as one file that both MLflow and raystream read: `model.pth` of an MLflow model.

MLflow's PyTorch flavour stores a model as a pickled module (`data/model.pth`); `mlflow.pytorch.load_model` unpickles
it (with `MLFLOW_ALLOW_PICKLE_DESERIALIZATION=true`, MLflow 3's rule for pickles). raystream reads checkpoints only
as tensors (`torch.load(weights_only=True)`), never unpickling arbitrary objects. One file serves both: `Saved`
pickles as a call `rebuild(config, state)` whose arguments are plain containers and tensors:
- unpickled by MLflow, `rebuild` builds the scenario's model from `config` (random init, never `backbone.init`)
  and loads `state`, so `load_model` gives the trained `nn.Module`;
- read by raystream (`models.checkpoint.read_state_dict`, which `scenario.backbone.init` uses), the weights-only
  unpickler is told that this one global (`SAVED_MODEL_GLOBAL` there) is a function that returns `state` untouched:
  no model is built and nothing but tensors and containers is unpickled.
Writing one needs only the state dict and the config (`Saved(config, state)`), no model: a driver or
`raystream tracking upload` writes it without building anything that scales with the model.
`rebuild` reads only the sections a model is built from (`scenario`, `stream`, `trainer.seed`), each over its own
schema, so this pure-torch module imports no config composition (raystream.config sits above models).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from omegaconf import OmegaConf
from torch import nn

from raystream.data.config import StreamConfig
from raystream.models.config import ScenarioConfig
from raystream.models.scenario import build_scenario

REBUILD = f"{__name__}.rebuild"  # the pickled global of a saved model


def rebuild(config: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> nn.Module:
    """The scenario model `config` (a run config as plain containers) describes, holding `state`, in eval mode."""
    scenario = OmegaConf.merge(OmegaConf.structured(ScenarioConfig), dict(config.get("scenario") or {}))
    stream = OmegaConf.merge(OmegaConf.structured(StreamConfig), dict(config.get("stream") or {}))
    scenario.backbone.init = "random"  # the weights come from `state`, not from the start it was trained from
    seed = int((config.get("trainer") or {}).get("seed", 0))  # TrainerConfig.seed's default
    model = build_scenario(scenario, stream, seed).model
    model.load_state_dict(dict(state))
    return model.eval()


class Saved(nn.Module):
    """A stand-in that `torch.save` pickles as `rebuild(config, state)`: MLflow's `save_model` takes it as the
    module (it holds no parameters of its own)."""

    def __init__(self, config: Mapping[str, Any], state: Mapping[str, torch.Tensor]):
        super().__init__()
        self.config, self.state = dict(config), dict(state)

    def __reduce__(self):
        return rebuild, (self.config, self.state)

