"""raystream.models: ViT backbones and the paper's scenarios, pure PyTorch (no Ray, no MLflow).

    scenario = build_scenario(scenario_cfg, stream_cfg, seed=0)
    scenario.model(batch_dict) -> {'loss', ...}; scenario.set_total_steps(n); scenario.after_step(step); scenario.needs
    scenario.evaluate(model, eval_cfg, probe=None, heldout=None) -> {'eval/<metric>': float}

    vit.py                the Vision Transformer backbone (images and video tubelets), its presets, compiled blocks
    pixels.py             pixels in and out: normalisation, tubelet patchify, VideoMAE's target, the pixel decoders
    videomae.py           VideoMAE: masked tube reconstruction (section 4.2), with its tube masks
    future_prediction.py  future prediction (section 4.3): 4 frames predict the 4 that follow
    dora/                 DoRA (Table 1): its own package, one file per role
    scenario.py           the interface every scenario shows the training loop, and the registry
    checkpoint.py         a model initialised from a local state dict or an earlier raystream run
    published.py          published ViT checkpoints translated to raystream's ViT keys
    saved.py              a trained scenario model as one file MLflow and raystream both read (model.pth)
    config.py             ScenarioConfig: the `scenario` group (plain data)
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
