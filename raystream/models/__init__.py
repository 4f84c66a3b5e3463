"""raystream.models: ViT backbones and the paper's scenarios, pure PyTorch (no Ray, no MLflow).

    scenario = build_scenario(scenario_cfg, stream_cfg, seed=0)
    scenario.model(batch_dict) -> {'loss', ...}; scenario.set_total_steps(n); scenario.after_step(step); scenario.needs
    scenario.evaluate(model, eval_cfg, probe=None, heldout=None) -> {'eval/<metric>': float}

One file per role: vit.py (backbone, presets), pixels.py (patchify, targets, the pixel decoders), videomae.py
(with its tube masks), future_prediction.py, scenario.py (interface, registry), checkpoint.py (initialisation).
"""

from raystream.models import future_prediction, videomae  # noqa: F401  (register the scenarios)
from raystream.models.checkpoint import CheckpointError, initialise, load_state_dict_file, resolve_checkpoint
from raystream.models.future_prediction import FuturePredictor
from raystream.models.scenario import Scenario, build_scenario, register_scenario
from raystream.models.videomae import VideoMAE
from raystream.models.vit import PRESETS, VisionTransformer, build_vit

__all__ = ["build_scenario", "Scenario", "register_scenario", "VisionTransformer", "build_vit", "PRESETS",
           "VideoMAE", "FuturePredictor", "CheckpointError", "initialise", "load_state_dict_file",
           "resolve_checkpoint"]
