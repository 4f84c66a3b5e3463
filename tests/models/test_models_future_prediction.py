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


def test_linear_decoder_maps_each_input_token_to_the_target_tubelet_at_its_place():
    """scenario.decoder=linear (the paper's Table 7): one linear layer from encoder token i to the pixels of target
    token i (same tubelet slot, 0.64 s later); no attention, no mask tokens."""
    from raystream.models.pixels import LinearDecoder
    from raystream.models.pixels import normalize_input, unpatchify

    sc = build_scenario(tiny_cfg("future_prediction", norm_pix_loss=False, decoder="linear"),
                        stream_cfg(target_frames=4), seed=0)
    model = sc.model
    assert isinstance(model.decoder, LinearDecoder)
    assert sum(p.numel() for p in model.decoder.parameters()) == 96 * (2 * 8 * 8 * 3) + 2 * 8 * 8 * 3
    x = torch.rand(2, 4, 3, 32, 32)
    with torch.no_grad():
        by_hand = unpatchify(model.decoder.head(model.encoder(normalize_input(x))), 4, 32, 32, 8, 2, 3)
        assert torch.allclose(model.predict(x), by_hand)
    out = model({"frames": x, "target": torch.rand(2, 4, 3, 32, 32), "index": torch.arange(2), "step": 0})
    out["loss"].backward()
    assert model.decoder.head.weight.grad.abs().sum() > 0 and model.encoder.blocks[0].attn.qkv.weight.grad is not None


def test_linear_decoder_needs_a_target_token_for_every_input_token():
    from raystream.config import ConfigError, compose

    with pytest.raises(ValueError, match=r"`stream.target_frames` = `stream.frames_per_clip`, got 2 and 4"):
        build_scenario(tiny_cfg("future_prediction", decoder="linear"), stream_cfg(target_frames=2))
    with pytest.raises(ConfigError, match=r"`stream.target_frames` = `stream.frames_per_clip`, got 2 and 4"):
        compose(["scenario=future_prediction", "scenario.decoder=linear", "stream.target_frames=2"])
    with pytest.raises(ConfigError, match=r"`scenario.decoder` = 'linear' with `scenario.name` = 'videomae'"):
        compose(["scenario=videomae", "scenario.decoder=linear"])
    with pytest.raises(ValueError, match=r"`scenario.decoder` = 'linear' with `scenario.name` = 'videomae'"):
        build_scenario(tiny_cfg("videomae", decoder="linear"), stream_cfg())
