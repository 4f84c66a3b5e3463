"""Model FLOPs per step and MFU (raystream/bench/flops.py): the count against a hand count of a ViT, the meta-device
count of a scenario against the same count on real tensors, the paper presets counted here in seconds, and the
device peaks MFU is taken against."""

import time

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from raystream.bench import flops
from raystream.config import compose
from raystream.models import build_scenario
from raystream.models.vit import VisionTransformer


def vit_hand_count(batch: int, tokens: int, dim: int, depth: int, patch_inputs: int) -> int:
    """A ViT's forward and backward in FLOPs (2 a multiply-add), counted by hand: per token of a block, the linear
    layers (qkv 3D^2, proj D^2, fc1 and fc2 4D^2 each: 12 D^2 multiply-adds) and attention (QK^T and AV: 2 N D);
    the backward takes twice the forward (the input's and the weight's gradients). The patch embedding: N K D
    multiply-adds forward, and the weight's gradient only backward (the frames need none)."""
    block = 2 * (12 * tokens * dim ** 2 + 2 * tokens ** 2 * dim)
    return batch * (3 * depth * block + 2 * 2 * tokens * patch_inputs * dim)


def test_a_vit_counts_as_the_hand_count():
    b, frames, side, patch, tubelet, dim, depth = 2, 4, 32, 8, 2, 48, 2
    with torch.device("meta"):
        vit = VisionTransformer(img_size=side, patch_size=patch, embed_dim=dim, depth=depth, num_heads=3,
                                num_frames=frames, tubelet_size=tubelet)
        clips = torch.empty(b, frames, 3, side, side)
    counted = flops.count_flops(lambda: vit(clips).pow(2).mean())  # a loss of no matrix product
    tokens = (frames // tubelet) * (side // patch) ** 2
    assert counted == vit_hand_count(b, tokens, dim, depth, 3 * tubelet * patch ** 2)
    # 2 x params x tokens per clip (forward) and twice that backward: the rule of thumb, attention aside
    params = sum(p.numel() for p in vit.blocks.parameters() if p.dim() == 2)
    assert counted > 6 * params * tokens * b


def test_the_meta_count_of_a_scenario_is_the_count_on_real_tensors():
    """step_flops builds the scenario on the meta device; the same model on real tensors, with the same inputs'
    shapes, counts the same (attention in the math kernel: FlopCounterMode counts no FLOPs for the CPU's flash
    attention kernel, which a real CPU run would pick)."""
    cfg = compose(["scenario.backbone.depth=2", "stream.batch_size=2"])
    meta = flops.step_flops(cfg, 2)
    torch.manual_seed(0)
    model = build_scenario(cfg.scenario, cfg.stream, seed=0).model.train()
    inputs = {k: torch.zeros_like(v, device="cpu") if torch.is_tensor(v) and v.is_meta else v
              for k, v in flops.meta_inputs(cfg.stream, 2).items()}
    with sdpa_kernel(SDPBackend.MATH):
        real = flops.count_flops(lambda: model(inputs)["loss"])
    assert meta == real > 0
    assert flops.step_flops(cfg, 4) == 2 * meta  # every FLOP is some clip's: linear in the batch


@pytest.mark.parametrize("preset, batch, low, high", [
    # ViT-L/16 (304M parameters in its blocks), 4 frames in tubelets of 2 at 224 px: 392 tokens a clip, plus the
    # predictor; 6 x params x tokens = 0.72 TFLOP a clip
    ("future_prediction_paper", 16, 16 * 0.72e12, 16 * 1.2e12),
    # ViT-B/16 (85M), 16 frames: 1568 tokens of which VideoMAE's encoder sees 10 % (157), plus its decoder on all
    ("videomae_paper", 64, 64 * 6 * 85e6 * 157, 64 * 0.5e12),
])
def test_the_paper_presets_count_in_seconds_at_their_shapes(preset, batch, low, high):
    cfg = compose([f"+experiment={preset}", "data=walking_tour", "data.videos=null", "data.heldout_videos=null",
                   "eval.dataset=null", "trainer.num_workers=1", f"stream.batch_size={batch}"])
    t0 = time.perf_counter()
    counted = flops.step_flops(cfg, batch)
    print(f"{preset}: {counted / 1e12:.2f} TFLOP a step at batch {batch}, counted in {time.perf_counter() - t0:.1f} s")
    assert low < counted < high


def test_peaks_by_device_name_and_the_override():
    cuda = torch.device("cuda")
    for name, peak in [("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                       ("NVIDIA H100 NVL", 835.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
                       ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.05), ("NVIDIA L40", 181.05), ("NVIDIA A10", 125.0),
                       ("NVIDIA GH200 480GB", 989.0)]:
        found, source = flops.peak_tflops(cuda, name=name)
        assert found == peak and "datasheet" in source, name
    found, why = flops.peak_tflops(cuda, name="NVIDIA GeForce GTX 1080")
    assert found is None and "'NVIDIA GeForce GTX 1080' is not in" in why and why.endswith(flops.UNKNOWN)
    found, why = flops.peak_tflops(torch.device("cpu"))
    assert found is None and "CPU" in why and flops.UNKNOWN in why
    assert flops.peak_tflops(torch.device("cpu"), 1.5) == (1.5, "--peak-tflops")
    assert flops.peak_tflops(cuda, 500.0, name="NVIDIA H200") == (500.0, "--peak-tflops")
    with pytest.raises(ValueError, match=r"--peak-tflops 0.0: expected a peak > 0"):
        flops.peak_tflops(cuda, 0.0)


def test_mfu_is_the_achieved_rate_over_the_peak_or_unknown():
    assert flops.figures(int(2e12), 10.0, 100.0) == {"tflops_per_s": 20.0, "mfu": 0.2}
    assert flops.figures(int(2e12), 10.0, None) == {"tflops_per_s": 20.0, "mfu": None}
    assert flops.mfu_text(0.2) == "20.0 %" and flops.mfu_text(None) == "unknown (pass --peak-tflops)"
    assert flops.flops_text(3.83e7) == "38.3 MFLOP" and flops.flops_text(1.2e13, "FLOP/s") == "12 TFLOP/s"
