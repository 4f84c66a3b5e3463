"""Future prediction: shapes, in-stream error measured before the update, out-of-stream with no learning."""

import pytest
import torch

from raystream.eval.pixels import per_sample_mse
from raystream.models import build_scenario
from scenario_helpers import correlated_batches, stream_cfg, tiny_cfg


def _scenario(seed=0):
    return build_scenario(tiny_cfg("future_prediction", norm_pix_loss=False, decoder_depth=2),
                          stream_cfg(target_frames=4), seed=seed)


def test_predicts_the_target_frames():
    model = _scenario().model
    x = torch.rand(2, 4, 3, 32, 32)
    assert model.predict(x).shape == (2, 4, 3, 32, 32)
    out = model({"frames": x, "target": torch.rand(2, 4, 3, 32, 32), "index": torch.arange(2), "step": 0})
    assert set(out) == {"loss", "in_stream/mse", "in_stream/psnr"}
    assert out["loss"].requires_grad and not out["in_stream/mse"].requires_grad


def test_in_stream_error_is_measured_before_the_update():
    model = _scenario().model
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = next(correlated_batches(1, batch=4, target=4))
    with torch.no_grad():
        before = per_sample_mse(model.predict(batch["frames"]), batch["target"]).mean()
    out = model(batch)
    opt.zero_grad()
    out["loss"].backward()
    opt.step()
    with torch.no_grad():
        after = per_sample_mse(model.predict(batch["frames"]), batch["target"]).mean()
    assert torch.allclose(out["in_stream/mse"], before, rtol=1e-5)
    assert not torch.allclose(out["in_stream/mse"], after, rtol=1e-3)  # measured after would fail here
    assert out["in_stream/psnr"] > 0


def test_needs_target_frames():
    with pytest.raises(ValueError, match="stream.target_frames"):
        build_scenario(tiny_cfg("future_prediction"), stream_cfg(target_frames=0))
    with pytest.raises(ValueError, match="stream.target_frames"):
        build_scenario(tiny_cfg("future_prediction"), stream_cfg(target_frames=3))
    model = _scenario().model
    with pytest.raises(ValueError, match="stream.target_frames"):
        model({"frames": torch.rand(1, 4, 3, 32, 32), "target": None, "index": torch.arange(1), "step": 0})


def test_out_of_stream_evaluation_does_not_learn():
    sc = _scenario()
    model = sc.model
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    heldout = [type("B", (), {"frames": b["frames"], "target": b["target"]})()
               for b in correlated_batches(3, batch=2, target=4)]
    metrics = sc.evaluate(model, type("E", (), {"heldout_batches": 2})(), heldout=heldout)
    assert set(metrics) == {"eval/mse_out_of_stream", "eval/psnr_out_of_stream"}
    assert metrics["eval/mse_out_of_stream"] > 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert model.training
