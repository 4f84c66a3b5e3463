"""ViT backbone: preset parameter counts against ViT-S/B/L, token shapes, masking, positions."""

import math

import pytest
import torch

from raystream.config import compose
from raystream.models import build_scenario
from raystream.models.vit import PRESETS, VisionTransformer, sinusoid_table

# timm's vit_{small,base,large}_patch16_224 without the 1000-class head (DINO's backbones).
VIT_PARAMS = {"small": 21_665_664, "base": 85_798_656, "large": 303_301_632}


def count(module):
    return sum(p.numel() for p in module.parameters())


def video_params(preset: str) -> int:
    """The image ViT's count without [CLS] and learned positions, with a 2 x 16 x 16 Conv3d tubelet embedding."""
    d = PRESETS[preset].embed_dim
    return VIT_PARAMS[preset] - d - 197 * d - 3 * 16 * 16 * d + 3 * 2 * 16 * 16 * d


@pytest.mark.parametrize("preset", ["small", "base", "large"])
def test_image_presets_match_vit_s_b_l_parameter_counts(preset):
    s = PRESETS[preset]
    with torch.device("meta"):
        vit = VisionTransformer(img_size=224, patch_size=s.patch_size, embed_dim=s.embed_dim, depth=s.depth,
                                num_heads=s.num_heads)
    assert count(vit) == VIT_PARAMS[preset]


def test_video_preset_swaps_image_patch_embedding_for_tubelets():
    s = PRESETS["base"]
    with torch.device("meta"):
        vit = VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_frames=16,
                                tubelet_size=2)
    # no [CLS], no learned positions (fixed sinusoid), Conv3d 2x16x16 instead of Conv2d 16x16
    assert count(vit) == video_params("base") == 86_236_416 and s.embed_dim == 768


@pytest.mark.parametrize("scenario, frames, preset, decoder", [
    ("videomae_paper", 16, "base", "PixelDecoder"), ("future_prediction_paper", 4, "large", "LinearDecoder")])
def test_paper_scale_scenarios_construct_from_config(scenario, frames, preset, decoder):
    cfg = compose([f"scenario={scenario}"])
    with torch.device("meta"):
        sc = build_scenario(cfg.scenario, cfg.stream, seed=0)
    assert cfg.stream.resolution == 224 and cfg.stream.frames_per_clip == frames
    # ViT-B/16 86.2M; ViT-L/16 304.1M: learned positions and [CLS] (1 + 197 tokens), as its ImageNet-21K start's
    learned = (1 + 197) * PRESETS[preset].embed_dim if scenario == "future_prediction_paper" else 0
    assert count(sc.model.encoder) == video_params(preset) + learned
    assert type(sc.model.decoder).__name__ == decoder
    if decoder == "PixelDecoder":
        assert sc.model.decoder.dim == 384 and len(sc.model.decoder.blocks) == 4
    else:  # Table 7: one linear map, token -> the 2 x 16 x 16 x 3 pixels of its target tubelet
        assert count(sc.model.decoder) == 1024 * 1536 + 1536


def test_every_backbone_preset_has_a_shape():
    from raystream.models.config import BACKBONE_PRESETS

    assert tuple(PRESETS) == BACKBONE_PRESETS


def test_tiny_video_tokens_and_visible_only_encoding():
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=96, depth=2, num_heads=3, num_frames=4,
                            tubelet_size=2)
    x = torch.randn(2, 4, 3, 32, 32)
    assert vit(x).shape == (2, 2 * 4 * 4, 96)
    mask = torch.zeros(2, 32, dtype=torch.bool)
    mask[:, :28] = True
    assert vit(x, mask=mask).shape == (2, 4, 96)
    assert vit.features(x).shape == (2, 96)
    with pytest.raises(ValueError, match="mask has shape"):
        vit(x, mask=mask[:, :10])


def test_image_vit_has_cls_and_interpolates_positions():
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=96, depth=1, num_heads=3)
    assert vit(torch.randn(2, 3, 32, 32)).shape == (2, 1 + 16, 96)
    assert vit(torch.randn(2, 3, 16, 16)).shape == (2, 1 + 4, 96)  # DoRA-style smaller crop
    assert vit.features(torch.randn(2, 3, 32, 32)).shape == (2, 96)


def test_sinusoid_table_is_videomae_formula():
    table = sinusoid_table(10, 8)[0]
    pos, i = 7, 5
    assert math.isclose(float(table[pos, i]), math.cos(pos / 10000 ** (2 * (i // 2) / 8)), rel_tol=1e-6)
    assert math.isclose(float(table[pos, 4]), math.sin(pos / 10000 ** (4 / 8)), rel_tol=1e-6)


def test_paper_scale_videomae_small_runs_a_clip():
    cfg = compose(["scenario=videomae_paper", "scenario.backbone.preset=small"])
    sc = build_scenario(cfg.scenario, cfg.stream, seed=0)
    seen = {}
    sc.model.encoder.blocks[0].register_forward_hook(lambda m, i, o: seen.update(shape=i[0].shape))
    with torch.no_grad():
        out = sc.model({"frames": torch.rand(1, 16, 3, 224, 224), "index": torch.arange(1), "step": 0})
    assert seen["shape"] == (1, 8 * (196 - int(0.9 * 196)), 384)  # 8 x 20 visible tubelets of 1568
    assert count(sc.model.decoder) == 2_150_400 and torch.isfinite(out["loss"])
