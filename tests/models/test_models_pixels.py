"""Tubelet patchify order matches the encoder's tokens; the normalised-pixel target; uint8 inputs."""

import torch

from raystream.models.pixels import as_float, patch_target, patchify, unpatchify
from raystream.models.vit import PatchEmbed


def test_patchify_roundtrip():
    x = torch.rand(2, 4, 3, 16, 24)
    p = patchify(x, 8, 2)
    assert p.shape == (2, 2 * 2 * 3, 2 * 8 * 8, 3)
    assert torch.equal(unpatchify(p.flatten(2), 4, 16, 24, 8, 2, 3), x)


def test_patch_order_is_token_order_of_the_conv_embedding():
    # every tubelet holds its own constant value; an averaging Conv3d must see them in patchify's order
    t_, h_, w_ = 2, 3, 4
    values = torch.arange(t_ * h_ * w_, dtype=torch.float32).reshape(t_, h_, w_)
    x = values.repeat_interleave(2, 0).repeat_interleave(8, 1).repeat_interleave(8, 2)  # (4, 24, 32)
    x = x[None, :, None].expand(1, 4, 3, 24, 32).contiguous()
    embed = PatchEmbed(8, 2, 3, 1, video=True)
    with torch.no_grad():
        embed.proj.weight.fill_(1.0 / embed.proj.weight[0].numel())
        embed.proj.bias.zero_()
    tokens, grid = embed(x)
    assert grid == (t_, h_, w_)
    assert torch.allclose(tokens[0, :, 0], values.flatten(), atol=1e-4)
    assert torch.allclose(patchify(x, 8, 2)[0].mean(dim=(1, 2)), values.flatten())


def test_normalised_pixel_target_has_zero_mean_unit_std_per_patch_and_channel():
    x = torch.rand(2, 4, 3, 16, 16) * 0.5 + 0.2
    target = patch_target(x, 8, 2, normalize=True).reshape(2, 8, 128, 3)
    assert torch.allclose(target.mean(dim=2), torch.zeros(2, 8, 3), atol=1e-5)
    assert torch.allclose(target.std(dim=2), torch.ones(2, 8, 3), atol=1e-3)
    raw = patch_target(x, 8, 2, normalize=False)
    assert torch.equal(raw, patchify(x, 8, 2).flatten(2))


def test_uint8_frames_become_unit_range():
    x = torch.tensor([0, 255], dtype=torch.uint8)
    assert torch.equal(as_float(x), torch.tensor([0.0, 1.0]))
