"""VideoMAE: visible-only encoding, masked-token MSE, worker-count-independent gradients, learning."""

import pytest
import torch

from raystream.models import build_scenario
from raystream.models.pixels import patch_target
from scenario_helpers import stream_cfg, tiny_cfg


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_encoder_sees_only_visible_tokens_and_loss_is_masked_mse():
    sc = build_scenario(tiny_cfg(), stream_cfg(), seed=0)
    model = sc.model
    seen, captured = {}, {}
    model.encoder.blocks[0].register_forward_hook(lambda m, i, o: seen.update(shape=i[0].shape))
    model.decoder.register_forward_hook(lambda m, i, o: captured.update(pred=o))
    x = torch.rand(3, 4, 3, 32, 32)
    out = model({"frames": x, "target": None, "index": torch.arange(3), "step": 0})
    assert seen["shape"] == (3, 2 * (16 - int(0.9 * 16)), 96)  # 2 temporal slices x 2 visible positions
    mask = model.masks(x, 0, torch.arange(3))
    target = patch_target(x, 8, 2)[mask].reshape(3, -1, 2 * 8 * 8 * 3)
    assert captured["pred"].shape == target.shape
    assert torch.allclose(out["loss"], ((captured["pred"] - target) ** 2).mean())


def test_positions_kept_are_the_boolean_masks_tokens_with_the_same_gradients():
    """The step selects tokens by positions made on the host (no device sync); a boolean mask selects the same
    tokens in the same order, and its gradients are the same."""
    from raystream.models.videomae import visible_and_hidden

    encoder = build_scenario(tiny_cfg(), stream_cfg(), seed=0).model.encoder
    x = torch.rand(3, 4, 3, 32, 32)
    mask = build_scenario(tiny_cfg(), stream_cfg(), seed=0).model.masks(x, 5, torch.arange(3))
    visible, hidden = visible_and_hidden(mask, x.device)
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    assert torch.equal(visible, positions[~mask].reshape(3, -1)) and torch.equal(hidden, positions[mask].reshape(3, -1))
    outs, grads = [], []
    for how in ({"mask": mask}, {"keep": visible}):
        encoder.zero_grad(set_to_none=True)
        out = encoder(x, **how)
        out.square().mean().backward()
        outs.append(out.detach())
        grads.append(_grads(encoder))
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
    with pytest.raises(ValueError, match=r"hide \[2, 1\] tokens per clip"):
        visible_and_hidden(torch.tensor([[True, True, False], [True, False, False]]), x.device)


@pytest.mark.parametrize("mode", ["per_sample", "per_batch", "fixed"])
def test_global_gradient_is_the_same_for_one_or_two_workers(mode):
    sc = build_scenario(tiny_cfg(**{"mask.mode": mode}), stream_cfg(), seed=1)
    model = sc.model
    x = torch.rand(4, 4, 3, 32, 32)
    model({"frames": x, "index": torch.arange(4), "step": 7})["loss"].backward()
    full = _grads(model)
    model.zero_grad(set_to_none=True)
    shards = []
    for rank in range(2):  # what DDP all-reduce averages: each rank's mean loss over its shard
        idx = torch.arange(2 * rank, 2 * rank + 2)
        model({"frames": x[idx], "index": idx, "step": 7})["loss"].backward()
        shards.append(_grads(model))
        model.zero_grad(set_to_none=True)
    assert torch.allclose(full, (shards[0] + shards[1]) / 2, atol=1e-6, rtol=1e-4)


def test_forward_is_deterministic_given_seed_step_and_index():
    a = build_scenario(tiny_cfg(), stream_cfg(), seed=0).model
    b = build_scenario(tiny_cfg(), stream_cfg(), seed=0).model
    x = torch.rand(2, 4, 3, 32, 32)
    batch = {"frames": x, "index": torch.tensor([5, 6]), "step": 3}
    assert torch.equal(a(batch)["loss"], b(batch)["loss"])
    c = build_scenario(tiny_cfg(), stream_cfg(), seed=1).model
    assert not torch.equal(a(batch)["loss"], c(batch)["loss"])


def test_uint8_stream_gives_the_same_loss_as_float():
    model = build_scenario(tiny_cfg(), stream_cfg(), seed=0).model
    x8 = torch.randint(0, 256, (2, 4, 3, 32, 32), dtype=torch.uint8)
    la = model({"frames": x8, "index": torch.arange(2), "step": 0})["loss"]
    lb = model({"frames": x8.float() / 255, "index": torch.arange(2), "step": 0})["loss"]
    assert torch.allclose(la, lb)
