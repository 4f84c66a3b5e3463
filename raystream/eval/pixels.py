"""Pixel-prediction metrics: MSE and PSNR of predicted frames in [0, 1].

Both are computed per sample on predictions clamped to [0, 1] (the frames a model would output) and averaged over
samples, so the in-stream metric (the train loop averaging `in_stream/*` over the stream) and the out-of-stream
metric (held-out batches, no learning) are the same quantity on different data.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional

import torch


def per_sample_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) mean squared error of each sample, predictions clamped to [0, 1]."""
    if pred.shape != target.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} != target shape {tuple(target.shape)}")
    diff = pred.detach().float().clamp(0.0, 1.0) - target.detach().float()
    return diff.pow(2).flatten(1).mean(dim=1)


def psnr_from_mse(mse: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """PSNR in dB of each MSE value, 10 log10(range^2 / MSE), MSE floored at 1e-10."""
    return 10.0 * torch.log10(data_range ** 2 / mse.clamp_min(1e-10))


def psnr(pred: torch.Tensor, target: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Mean over samples of the per-sample PSNR in dB."""
    return psnr_from_mse(per_sample_mse(pred, target), data_range).mean()


def pixel_metrics(pred: torch.Tensor, target: torch.Tensor) -> Dict[str, torch.Tensor]:
    """{'mse', 'psnr'} of a batch of predicted frames (detached scalars)."""
    mse = per_sample_mse(pred, target)
    return {"mse": mse.mean(), "psnr": psnr_from_mse(mse).mean()}


@torch.no_grad()
def heldout_pixel_metrics(predict: Callable[[torch.Tensor], torch.Tensor], batches: Iterable,
                          max_batches: Optional[int] = None, device: Optional[torch.device] = None,
                          suffix: str = "out_of_stream") -> Dict[str, float]:
    """Out-of-stream error: `predict(frames) -> predicted target` on held-out batches, no learning.

    `batches` yields objects with `.frames` and `.target` (data.Batch) or dicts with those keys; a generator is
    closed once `max_batches` are read. Returns
    {'eval/mse_<suffix>', 'eval/psnr_<suffix>'} averaged over samples.
    """
    mse_sum, psnr_sum, count = 0.0, 0.0, 0
    it = iter(batches)
    try:
        for i, batch in enumerate(it):
            if max_batches is not None and i >= max_batches:
                break
            frames = batch["frames"] if isinstance(batch, dict) else batch.frames
            target = batch["target"] if isinstance(batch, dict) else batch.target
            if target is None:
                raise ValueError("held-out batch has no target frames: set stream.target_frames > 0")
            if device is not None:
                frames, target = frames.to(device), target.to(device)
            if target.dtype == torch.uint8:
                target = target.float() / 255.0
            mse = per_sample_mse(predict(frames), target)
            mse_sum += float(mse.sum())
            psnr_sum += float(psnr_from_mse(mse).sum())
            count += mse.shape[0]
    finally:
        if it is batches and hasattr(it, "close"):
            it.close()  # a stream's generator: stop its prefetching
    if count == 0:
        raise ValueError("held-out stream yielded no batches")
    return {f"eval/mse_{suffix}": mse_sum / count, f"eval/psnr_{suffix}": psnr_sum / count}
