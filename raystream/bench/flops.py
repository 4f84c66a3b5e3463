"""Model FLOPs per training step and the model FLOPs utilisation (MFU) that `raystream bench` and the GPU campaign
print beside steps/s.

    flops = step_flops(cfg, batch_size)              # one worker's forward and backward, counted once
    peak, source = peak_tflops(device, override)     # the device's dense bf16 peak, or None (and why)
    figures(flops, steps_per_s, peak)                # achieved TFLOP/s and MFU = achieved / peak

The count: torch's FlopCounterMode over the scenario's model (`scenario.model(inputs)` and `loss.backward()`, as
raystream/train/step.py takes them) at the preset's real shapes (the per-worker batch of `stream.frames_per_clip`
frames at `stream.resolution`, and its target frames), with the model and the batch on the meta device: no weights
are allocated and nothing is computed, so ViT-L's count takes a second on a CPU. FlopCounterMode counts matrix
products, convolutions and attention (2 FLOPs a multiply-add; a backward counts the gradients it takes, e.g. none
for the input of the patch embedding), not the elementwise work (norms, activations, the optimizer step): the
convention of MFU (PaLM, appendix B), so a figure compares with published ones. The same count whatever the
autocast dtype: bf16 changes the time of a FLOP, not their number.

MFU = FLOPs per step x steps/s / the device's dense bf16 peak (no 2:4 sparsity). The peaks are the vendors'
datasheet figures (`PEAKS`, matched on `torch.cuda.get_device_name`); `--peak-tflops` overrides them, and names a
peak for a device not in the table or a CPU. Without one MFU is "unknown (pass --peak-tflops)": the FLOPs and the
achieved TFLOP/s are still printed. Pure torch: no Ray, no MLflow.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode

from raystream.models import build_scenario

# (a pattern on torch.cuda.get_device_name, dense bf16 tensor TFLOP/s, the source); the first match wins, so a
# variant (H100 PCIe) comes before its family (H100 SXM's "NVIDIA H100 80GB HBM3"). Datasheets give the figure with
# 2:4 sparsity first; the dense one is half of it.
PEAKS = [
    (r"\bGH200\b", 989.0, "NVIDIA GH200 Grace Hopper datasheet: H100 BF16 989 TFLOPS dense"),
    (r"\bH200\b", 989.0, "NVIDIA H200 datasheet (SXM): BF16 Tensor Core 1,979 TFLOPS with sparsity"),
    (r"\bH100\b.*\bPCIe\b", 756.0, "NVIDIA H100 datasheet, H100 PCIe: BF16 Tensor Core 1,513 TFLOPS with sparsity"),
    (r"\bH100\b.*\bNVL\b", 835.0, "NVIDIA H100 datasheet, H100 NVL: BF16 Tensor Core 1,671 TFLOPS with sparsity"),
    (r"\bH100\b", 989.0, "NVIDIA H100 datasheet, H100 SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity"),
    (r"\bB200\b", 2250.0, "NVIDIA HGX B200 datasheet: FP16/BF16 Tensor Core 4.5 PFLOPS per GPU with sparsity"),
    (r"\bA100\b", 312.0, "NVIDIA A100 datasheet (SXM and PCIe): BF16 Tensor Core 312 TFLOPS (624 with sparsity)"),
    (r"\bL40S\b", 362.05, "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity)"),
    (r"\bL40\b", 181.05, "NVIDIA L40 datasheet: BF16 Tensor Core 181.05 TFLOPS (362.1 with sparsity)"),
    (r"\bL4\b", 121.0, "NVIDIA L4 datasheet: BF16 Tensor Core 242 TFLOPS with sparsity"),
    (r"\bA10\b", 125.0, "NVIDIA A10 datasheet: BF16 Tensor Core 125 TFLOPS (250 with sparsity)"),
    (r"\bMI300X\b", 1307.4, "AMD Instinct MI300X datasheet: BF16 1,307.4 TFLOPS dense"),
]
UNKNOWN = "unknown (pass --peak-tflops)"


def peak_tflops(device: torch.device, override: Optional[float] = None,
                name: Optional[str] = None) -> Tuple[Optional[float], str]:
    """(the dense bf16 peak of `device` in TFLOP/s, where it comes from), or (None, why none is known). `override`
    (`--peak-tflops`) wins; `name`: the device's name (default: torch's, on CUDA)."""
    if override is not None:
        if not override > 0:
            raise ValueError(f"--peak-tflops {override}: expected a peak > 0 (TFLOP/s)")
        return float(override), "--peak-tflops"
    if device.type != "cuda":
        return None, f"no bf16 peak is known for a {device.type.upper()}: MFU {UNKNOWN}"
    name = name or torch.cuda.get_device_name(device)
    for pattern, peak, source in PEAKS:
        if re.search(pattern, name):
            return peak, source
    return None, f"{name!r} is not in raystream/bench/flops.py PEAKS: MFU {UNKNOWN}"


def meta_inputs(stream_cfg, batch_size: int) -> Dict[str, Any]:
    """A batch as `Batch.model_inputs` gives it (raystream/data/stream/batches.py), its frames and target on the
    meta device at the stream's shapes and dtype; `index` on the host, where the models read it."""
    dtype = torch.uint8 if str(stream_cfg.dtype) == "uint8" else torch.float32
    side = int(stream_cfg.resolution)

    def frames(n: int):
        return torch.empty(batch_size, n, 3, side, side, dtype=dtype, device="meta")

    target = int(stream_cfg.target_frames or 0)
    return {"frames": frames(int(stream_cfg.frames_per_clip)), "target": frames(target) if target else None,
            "index": torch.arange(batch_size), "step": 0}


def count_flops(forward: Callable[[], torch.Tensor]) -> int:
    """FLOPs of `forward()` (it returns the loss) and the loss's backward, as FlopCounterMode counts them."""
    with FlopCounterMode(display=False) as counter:
        forward().backward()
    return int(counter.get_total_flops())


def step_flops(cfg, batch_size: int) -> int:
    """Model FLOPs of one worker's training step at `batch_size` clips: the scenario's model built on the meta
    device from `cfg` (as `raystream.models.scenario.check_init` builds it), forward and backward on a meta batch
    of the configured shapes. Torch's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        with torch.device("meta"):
            scenario = build_scenario(cfg.scenario, cfg.stream, seed=int(cfg.trainer.seed))
        model = scenario.model.train()
        inputs = meta_inputs(cfg.stream, batch_size)
        return count_flops(lambda: model(inputs)["loss"])


def figures(flops: int, steps_per_s: float, peak: Optional[float]) -> Dict[str, Any]:
    """`tflops_per_s` achieved at `steps_per_s` and `mfu` (a fraction of `peak`; None without a peak)."""
    achieved = flops * steps_per_s / 1e12
    return {"tflops_per_s": achieved, "mfu": achieved / peak if peak else None}


def flops_text(flops: float, unit: str = "FLOP") -> str:
    """`flops` with an SI prefix: 12.3 TFLOP, 38.3 MFLOP/s."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(flops) >= scale:
            return f"{flops / scale:.3g} {prefix}{unit}"
    return f"{flops:.3g} {unit}"


def mfu_text(mfu: Optional[float]) -> str:
    """MFU as the table prints it: a percentage, or `unknown (pass --peak-tflops)`."""
    return UNKNOWN if mfu is None else f"{100 * mfu:.1f} %"
