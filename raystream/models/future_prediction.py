"""Future prediction (paper section 4.3, after Carreira et al. 2024): from 4 frames, predict the 4 that follow.

The stream supplies the input clip (`frames`, stream.frames_per_clip) and the frames to predict (`target`,
stream.target_frames, starting stream.target_offset_s after the clip). The encoder reads every input tubelet; the
decoder queries one mask token per tubelet of the target frames, at the sinusoidal positions that continue the
input's (t, h, w) order, and outputs pixels; or, with `scenario.decoder=linear` (the paper's Table 7), one linear
layer maps each input token to the target tubelet at the same place. Loss: pixel MSE.

In-stream evaluation: `forward` also returns `in_stream/mse` and `in_stream/psnr` of the very predictions the loss
is computed from (detached), i.e. the error on the incoming batch before the optimizer updates on it.
Out-of-stream evaluation: `Scenario.evaluate(..., heldout=...)` on a held-out stream with no learning.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from raystream.eval.pixels import pixel_metrics
from raystream.models.checkpoint import initialise
from raystream.models.config import ScenarioConfig, decoder_error
from raystream.models.pixels import Decoder, as_float, build_encoder_decoder, normalize_input, unpatchify
from raystream.models.scenario import Scenario, register_scenario
from raystream.models.vit import VisionTransformer


class FuturePredictor(nn.Module):
    """forward(batch_dict) -> {'loss', 'in_stream/mse', 'in_stream/psnr'}; predict(frames) -> target frames."""

    def __init__(self, encoder: VisionTransformer, decoder: Decoder, *, target_frames: int):
        super().__init__()
        self.encoder, self.decoder, self.target_frames = encoder, decoder, target_frames

    def predict(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, T_in, C, H, W) -> predicted (B, T_target, C, H, W) pixels (not clamped)."""
        x = as_float(frames)
        b, _, c, h, w = x.shape
        tokens = self.encoder(normalize_input(x))
        n_in = tokens.shape[1]
        n_out = self.encoder.num_tokens(self.target_frames, h, w)
        positions = torch.arange(n_in + n_out, device=x.device).expand(b, -1)
        patches = self.decoder(tokens, positions[:, :n_in], positions[:, n_in:], n_in + n_out)
        return unpatchify(patches, self.target_frames, h, w, self.encoder.patch_size, self.encoder.tubelet_size, c)

    def forward(self, batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        target = batch.get("target")
        if target is None:
            raise ValueError("future_prediction needs target frames in the batch: set stream.target_frames "
                             f"= {self.target_frames}")
        target = as_float(target)
        pred = self.predict(batch["frames"])
        if pred.shape != target.shape:
            raise ValueError(f"batch target has shape {tuple(target.shape)}, the model predicts {tuple(pred.shape)} "
                             "(stream.target_frames / stream.resolution changed since the model was built?)")
        metrics = pixel_metrics(pred, target)  # detached: the error on this batch before the update
        return {"loss": F.mse_loss(pred.float(), target), "in_stream/mse": metrics["mse"],
                "in_stream/psnr": metrics["psnr"]}

    def encode(self, clips: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        tokens = self.encoder(normalize_input(as_float(clips)))
        return self.encoder.pool(tokens), tokens


class FuturePredictionScenario(Scenario):
    name = "future_prediction"
    needs = frozenset({"heldout"})


@register_scenario("future_prediction")
def build_future_prediction(scenario_cfg: ScenarioConfig, stream_cfg: Any, seed: int = 0) -> FuturePredictionScenario:
    """A future predictor from `stream.frames_per_clip` frames to `stream.target_frames` frames."""
    target_frames = int(stream_cfg.target_frames)
    tubelet = int(scenario_cfg.backbone.tubelet_size)
    if target_frames < 1 or target_frames % tubelet:
        raise ValueError(f"stream.target_frames = {target_frames}: future_prediction needs target frames, a "
                         f"positive multiple of scenario.backbone.tubelet_size = {tubelet} (the paper: 4)")
    problem = decoder_error(scenario_cfg, stream_cfg)
    if problem:
        raise ValueError(problem)
    encoder, decoder = build_encoder_decoder(scenario_cfg, stream_cfg, seed)
    model = FuturePredictor(encoder, decoder, target_frames=target_frames)
    loaded = initialise(model, scenario_cfg.backbone.init, init_from=str(scenario_cfg.backbone.init_from))
    return FuturePredictionScenario(model, seed, init_line=loaded.line if loaded else None)
