"""Published checkpoints through `scenario.backbone.init`, checked against the reference libraries (transformers,
timm) on random weights: the reference model writes its file, raystream loads it, both see the same input."""

import argparse
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from raystream.config import ConfigError, compose
from raystream.models import CheckpointError, build_scenario
from raystream.models.published import to_vit_keys
from raystream.train.preflight import check_backbone_init
from fixtures.dino_reference import dino_interpolate_pos_encoding
from fixtures.timm_seeded import checksum, seeded_input, seeded_state
from reference_checkpoints import (dino_training_checkpoint, official_videomae_pretraining, timm_available,
                                   transformers_videomae, transformers_vit)
from scenario_helpers import stream_cfg, tiny_cfg

TOL = 1e-5
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def dora_backbone(init, preset, resolution=224, **backbone):
    cfg = tiny_cfg("dora", **{"backbone.preset": preset, "backbone.tubelet_size": 1, "backbone.init": str(init),
                              **{f"backbone.{k}": v for k, v in backbone.items()}})
    scenario = build_scenario(cfg, stream_cfg(frames_per_clip=2, resolution=resolution), seed=3)
    return scenario, scenario.model.teacher.backbone


def hf_tokens_at(hf, x, *pos_embeds):
    """transformers' ViT on `x` with its position table replaced by each of `pos_embeds` in turn (its own blocks and
    norm): one model at x's size for all of them (building one, weights drawn, costs a second at ViT-B)."""
    from transformers import ViTConfig, ViTModel

    size = x.shape[-1]
    other = ViTModel(ViTConfig(**{**hf.config.to_dict(), "image_size": size}), add_pooling_layer=False).eval()
    state = {k: v for k, v in hf.state_dict().items() if not k.startswith("pooler.")}
    out = []
    for pos_embed in pos_embeds:
        other.load_state_dict({**state, "embeddings.position_embeddings": pos_embed})
        with torch.no_grad():
            out.append(other(pixel_values=x).last_hidden_state)
    return out


def max_diff(a, b):
    return float((a - b).abs().max())


@pytest.fixture(scope="module", params=["small", "base"])
def vit_file(request, tmp_path_factory):
    path, hf = transformers_vit(tmp_path_factory.mktemp(request.param), request.param)
    scenario, backbone = dora_backbone(path, request.param)
    return request.param, path, hf, scenario, backbone


def test_transformers_vit_tokens_equal_at_224_and_dino_interpolated_at_96(vit_file):
    preset, path, hf, scenario, backbone = vit_file
    assert "transformers ViTModel" in scenario.init_line and str(path) in scenario.init_line
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, ref = backbone(x), hf(pixel_values=x).last_hidden_state
    assert max_diff(ours, ref) <= TOL
    crop = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    pos = hf.embeddings.position_embeddings.detach()
    tokens = torch.zeros(1, 1 + 36, pos.shape[-1])
    # the formula matters at this scale of positions: torch's plain bicubic resize to 6x6 is measurably another
    plain = torch.cat([pos[:, :1], nn.functional.interpolate(pos[:, 1:].reshape(1, 14, 14, -1).permute(0, 3, 1, 2),
                                                             size=(6, 6), mode="bicubic").flatten(2).transpose(1, 2)], 1)
    ref96, plain96 = hf_tokens_at(hf, crop, dino_interpolate_pos_encoding(pos, 16, tokens, 96, 96), plain)
    with torch.no_grad():
        ours96 = backbone(crop)
    assert max_diff(ours96, ref96) <= TOL
    assert max_diff(ours96, plain96) > 1e-2


def test_checkpoint_of_another_size_names_keys_shapes_and_the_preset_that_fits(vit_file, tmp_path):
    preset, path, *_ = vit_file
    other = "base" if preset == "small" else "small"
    with pytest.raises(CheckpointError, match=rf"{path.name}.*wrong shape.*patch_embed.proj.weight: checkpoint "
                                              rf"\(.*fits scenario.backbone.preset={preset}"):
        dora_backbone(path, other)
    cfg = compose(["scenario=dora", f"scenario.backbone.init={path}", f"scenario.backbone.preset={other}",
                   "stream.resolution=224"])
    with pytest.raises(ConfigError, match=f"fits scenario.backbone.preset={preset}"):
        check_backbone_init(cfg)  # the driver's check, before Ray starts (meta device: no weights allocated)


def test_dino_training_checkpoint_takes_the_teacher_unless_told(vit_file, tmp_path):
    preset, path, hf, *_ = vit_file
    if preset != "small":
        pytest.skip("one size is enough for the checkpoint's wrapping")
    teacher = to_vit_keys(load_file(str(path))).state  # the file transformers wrote, in DINO's key names
    student = {k: v + 0.01 for k, v in teacher.items()}
    ckpt = dino_training_checkpoint(tmp_path, student, teacher)
    x = torch.randn(1, 3, 224, 224)
    scenario, backbone = dora_backbone(ckpt, "small")
    assert "(the teacher)" in scenario.init_line and "dropped the DINO projection head" in scenario.init_line
    with torch.no_grad():
        assert max_diff(backbone(x), hf(pixel_values=x).last_hidden_state) <= TOL
    scenario, _ = dora_backbone(ckpt, "small", init_from="student")
    assert "(the student)" in scenario.init_line
    assert torch.equal(scenario.model.student.backbone.blocks[0].attn.qkv.weight, student["blocks.0.attn.qkv.weight"])
    assert torch.equal(scenario.model.teacher.backbone.norm.weight, student["norm.weight"])  # teacher starts equal


@pytest.fixture(scope="module")
def videomae_file(tmp_path_factory):
    directory = tmp_path_factory.mktemp("videomae")
    path, hf = transformers_videomae(directory, "small", image_size=64, num_frames=4, depth=2)
    return path, hf, official_videomae_pretraining(directory, hf)


@pytest.mark.parametrize("layout", ["transformers", "official"])
@pytest.mark.parametrize("qkv_bias", ["qv", "qkv"])
def test_videomae_encoder_tokens_equal_transformers(videomae_file, layout, qkv_bias):
    hf_path, hf, official = videomae_file
    path = hf_path if layout == "transformers" else official
    cfg = tiny_cfg(**{"backbone.preset": "small", "backbone.depth": 2, "backbone.init": str(path),
                      "backbone.qkv_bias": qkv_bias})
    scenario = build_scenario(cfg, stream_cfg(frames_per_clip=4, resolution=64), seed=0)
    expected = "transformers VideoMAEModel" if layout == "transformers" else "official VideoMAE pretraining"
    assert expected in scenario.init_line
    clip = torch.randn(2, 4, 3, 64, 64)
    with torch.no_grad():
        assert max_diff(scenario.model.encoder(clip), hf(pixel_values=clip).last_hidden_state) <= TOL


def test_videomae_deflates_into_the_dora_image_backbone(videomae_file):
    hf_path, hf, _ = videomae_file
    scenario, backbone = dora_backbone(hf_path, "small", resolution=64, depth=2)
    assert "deflated the 2-frame tubelet kernel" in scenario.init_line
    image = torch.randn(2, 3, 64, 64)
    with torch.no_grad():  # an image embeds as the static clip of its two copies did
        ours = backbone.patch_embed(image)[0]
        ref = hf.embeddings.patch_embeddings(image.unsqueeze(1).repeat(1, 2, 1, 1, 1))
    assert max_diff(ours, ref) <= TOL


def test_imagenet21k_vit_l_inflates_into_the_future_prediction_encoder(tmp_path):
    path, hf = transformers_vit(tmp_path, "large", image_size=64, depth=2, pooler=True)
    cfg = tiny_cfg("future_prediction", **{"backbone.preset": "large", "backbone.depth": 2, "backbone.init": str(path),
                                           "backbone.pos_embed": "learned", "decoder": "linear"})
    scenario = build_scenario(cfg, stream_cfg(frames_per_clip=4, target_frames=4, resolution=64), seed=0)
    assert "inflated the 2-D patch kernel to 2-frame tubelets" in scenario.init_line
    assert "dropped the pooler" in scenario.init_line
    image = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        tokens = scenario.model.encoder(image.unsqueeze(1).repeat(1, 4, 1, 1, 1))  # a clip of identical frames
        ref = hf(pixel_values=image).last_hidden_state[:, 1:]
    assert tokens.shape == (1, 2 * 16, 1024)
    for t in range(2):
        assert max_diff(tokens[:, 16 * t:16 * (t + 1)], ref) <= TOL
    with pytest.raises(CheckpointError, match="scenario.backbone.pos_embed=learned"):
        build_scenario(tiny_cfg("future_prediction", **{"backbone.preset": "large", "backbone.depth": 2,
                                                        "backbone.init": str(path)}),
                       stream_cfg(frames_per_clip=4, target_frames=4, resolution=64), seed=0)


def test_future_prediction_paper_takes_an_imagenet21k_timm_file_without_a_further_override(tmp_path):
    """Table 3's start as it comes: `+experiment=future_prediction_paper scenario.backbone.init=<ImageNet-21K ViT>`
    (timm's layout with its 21843-class head, at the tiny preset's shape) loads; its weights are the encoder's."""
    layout = TIMM_REFERENCE["in21k_tiny"]
    path = timm_file(tmp_path, layout)
    overrides = ["+experiment=future_prediction_paper", "scenario.backbone.preset=tiny", "stream.resolution=32",
                 f"scenario.backbone.init={path}", "data.videos=train.csv", "data.heldout_videos=heldout.csv"]
    cfg = compose(overrides)
    assert cfg.scenario.backbone.pos_embed == "learned"
    assert "dropped the classifier head" in check_backbone_init(cfg, say=False)  # the driver's check passes too
    # the user's own choice is honoured, and one that conflicts with the file stops before Ray starts, saying why
    with pytest.raises(ConfigError, match=r"vit.pth.*fixed sinusoid positions.*scenario.backbone.pos_embed=learned"):
        check_backbone_init(compose(overrides + ["scenario.backbone.pos_embed=sinusoid"]), say=False)
    scenario = build_scenario(cfg.scenario, cfg.stream, seed=0)
    assert "dropped the classifier head, 21843 classes" in scenario.init_line, scenario.init_line
    assert "inflated the 2-D patch kernel to 2-frame tubelets" in scenario.init_line
    own, state = scenario.model.encoder.state_dict(), seeded_state(layout, 0)
    assert torch.equal(own["cls_token"], state["cls_token"]) and torch.equal(own["blocks.2.mlp.fc2.weight"],
                                                                              state["blocks.2.mlp.fc2.weight"])


class NotNamespace:
    """An arbitrary object in a training checkpoint's `args`: refused, as any pickled object."""


def test_unknown_layout_function_changing_keys_and_pickles_are_refused(tmp_path):
    odd = tmp_path / "odd.pt"
    torch.save({"conv.weight": torch.zeros(3, 3)}, odd)
    with pytest.raises(CheckpointError, match=r"odd.pt.*no patch embedding.*timm ViT.*transformers ViTModel.*"
                                              r"official VideoMAE"):
        dora_backbone(odd, "tiny", resolution=32)
    base = build_scenario(tiny_cfg("dora", **{"backbone.tubelet_size": 1}), stream_cfg(frames_per_clip=2), 0)
    state = dict(base.model.student.backbone.state_dict())
    for extra, name in (({"fc_norm.weight": torch.ones(96)}, "fc_norm"), ({"reg_token": torch.zeros(1, 4, 96)},
                        "reg_token"), ({"blocks.0.ls1.gamma": torch.ones(96)}, "ls1")):
        torch.save({**state, **extra}, tmp_path / "timm_variant.pth")
        with pytest.raises(CheckpointError, match=rf"timm_variant.pth.*change the function.*{name}"):
            dora_backbone(tmp_path / "timm_variant.pth", "tiny", resolution=32)

    torch.save({"teacher": state, "student": state, "args": NotNamespace()}, tmp_path / "pickled.pth")
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*pickled.pth.*NotNamespace"):
        dora_backbone(tmp_path / "pickled.pth", "tiny", resolution=32)


def test_a_timm_layout_with_its_classifier_head_loads_without_the_head_and_says_so(tmp_path):
    """timm's key layout (DINO's too) with an ImageNet-21K head (21843 classes), as .pth and .safetensors: the head
    is dropped, the line says so, and the backbone holds the file's weights. (timm itself, where it imports, is the
    reference of the test below; here the layout is written by hand.)"""
    from safetensors.torch import save_file

    base = build_scenario(tiny_cfg("dora", **{"backbone.tubelet_size": 1}), stream_cfg(frames_per_clip=2), 0)
    state = {k: torch.randn_like(v) for k, v in base.model.student.backbone.state_dict().items()}
    with_head = {**state, "head.weight": torch.randn(21843, 96), "head.bias": torch.zeros(21843)}
    torch.save(with_head, tmp_path / "in21k.pth")
    save_file(with_head, str(tmp_path / "in21k.safetensors"))
    for name in ("in21k.pth", "in21k.safetensors"):
        scenario, backbone = dora_backbone(tmp_path / name, "tiny", resolution=32)
        assert "dropped the classifier head, 21843 classes" in scenario.init_line, scenario.init_line
        assert all(torch.equal(backbone.state_dict()[k], v) for k, v in state.items())


# timm's reference outputs and layouts, written by timm itself (tests/models/fixtures/make_timm_fixtures.py, in a
# venv where timm imports); the weights are drawn again here from the seed (fixtures/timm_seeded.py), so the
# comparisons run where timm does not import. Across torch builds float32 sums differ in their last bits: TIMM_TOL.
TIMM_REFERENCE = torch.load(FIXTURES / "timm_reference.pt", weights_only=True)
TIMM_TOL = 1e-4


def timm_file(directory, layout, seed=0, safetensors=False):
    """The checkpoint file of timm's `layout` holding the seeded weights, as a user downloads it."""
    state = seeded_state(layout, seed)
    path = directory / ("model.safetensors" if safetensors else "vit.pth")
    if safetensors:
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize("preset", ["small", "base"])
def test_timm_vit_with_head_tokens_equal_at_224_and_dino_interpolated_at_96(preset, tmp_path):
    ref = TIMM_REFERENCE["reference"][preset]
    path = timm_file(tmp_path, ref["layout"], ref["seed"], safetensors=preset == "base")
    scenario, backbone = dora_backbone(path, preset)
    assert "dropped the classifier head, 1000 classes" in scenario.init_line
    x = seeded_input((1, 3, 224, 224), ref["input_seed"])
    crop = seeded_input((1, 3, 96, 96), ref["input_seed"] + 1)
    assert (checksum(x), checksum(crop)) == (ref["input_checksums"]["224"], ref["input_checksums"]["96"])
    with torch.no_grad():
        assert max_diff(backbone(x), ref["out224"]) <= TIMM_TOL
        assert max_diff(backbone(crop), ref["out96"]) <= TIMM_TOL


@pytest.mark.parametrize("name", ["fc_norm", "reg_token", "ls1"])
def test_timm_variants_that_change_the_function_are_refused(name, tmp_path):
    path = timm_file(tmp_path, TIMM_REFERENCE["refused"][name])
    with pytest.raises(CheckpointError, match=rf"change the function.*{name}"):
        dora_backbone(path, "small", depth=1)


@pytest.mark.skipif(timm_available() is not None, reason=str(timm_available()))
def test_the_timm_fixture_is_what_timm_computes_here(tmp_path):
    """Where timm imports, its outputs for the fixture's seeded weights are the fixture's."""
    import timm

    ref = TIMM_REFERENCE["reference"]["small"]
    model = timm.create_model(ref["timm_name"], pretrained=False, num_classes=1000).eval()
    model.load_state_dict(seeded_state(ref["layout"], ref["seed"]))
    with torch.no_grad():
        assert max_diff(model.forward_features(seeded_input((1, 3, 224, 224), ref["input_seed"])),
                        ref["out224"]) <= TIMM_TOL


def test_dino_namespace_args_are_read_but_nothing_else(tmp_path):
    torch.save({"args": argparse.Namespace(a=1), "model": {"w": torch.zeros(1)}}, tmp_path / "ns.pth")
    with pytest.raises(CheckpointError, match="no patch embedding"):  # read (Namespace allowed), then no ViT
        dora_backbone(tmp_path / "ns.pth", "tiny", resolution=32)
