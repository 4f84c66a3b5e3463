"""MSE / PSNR of predicted frames, per sample, on clamped predictions; held-out evaluation."""

import math

import pytest
import torch

from raystream.eval import heldout_pixel_metrics, psnr
from raystream.eval.pixels import per_sample_mse, pixel_metrics


def test_psnr_by_hand():
    target = torch.full((2, 4, 3, 8, 8), 0.5)
    pred = target.clone()
    pred[0] += 0.1  # mse 0.01 -> 20 dB
    pred[1] += 0.01  # mse 1e-4 -> 40 dB
    assert math.isclose(float(psnr(pred, target)), 30.0, rel_tol=1e-4)
    m = pixel_metrics(pred, target)
    assert math.isclose(float(m["mse"]), (0.01 + 1e-4) / 2, rel_tol=1e-4)


def test_predictions_are_clamped_to_the_frame_range():
    target = torch.ones(1, 3)
    assert float(per_sample_mse(torch.full((1, 3), 1.5), target)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        per_sample_mse(torch.zeros(1, 3), torch.zeros(1, 4))


def test_heldout_metrics_average_over_samples_and_respect_the_batch_cap():
    batches = [{"frames": torch.zeros(2, 1), "target": torch.full((2, 1), v)} for v in (0.1, 0.2, 0.9)]
    out = heldout_pixel_metrics(lambda f: torch.zeros(f.shape[0], 1), batches, max_batches=2)
    assert math.isclose(out["eval/mse_out_of_stream"], (0.01 + 0.04) / 2, rel_tol=1e-5)
    assert math.isclose(out["eval/psnr_out_of_stream"], (20 + 10 * math.log10(1 / 0.04)) / 2, rel_tol=1e-5)
    with pytest.raises(ValueError, match="target_frames"):
        heldout_pixel_metrics(lambda f: f, [{"frames": torch.zeros(1, 1), "target": None}])
