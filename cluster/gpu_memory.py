"""Estimate the GPU memory one training step of a ViT preset needs, from raystream's own model, without a GPU.

    python cluster/gpu_memory.py                                   # ViT-S/B/L VideoMAE at paper scale
    python cluster/gpu_memory.py --scenario future_prediction_paper --stream future_prediction --batch 8 32

How: the scenario's model is built from the composed config (default: scenario=videomae_paper stream=videomae,
16 frames at 224 px, tube masking 0.9) and one forward pass runs on the CPU under bf16 autocast, with a hook
that adds up the bytes autograd saves for the backward pass (each storage once). Two batch sizes give the
activation bytes per clip. Static bytes are counted per parameter: fp32 weight 4 + fp32 gradient 4 + AdamW
moments 8 + the orthogonal optimizer's EMA 4 + the previous gradient kept for grad_cos_prev 4 + the bf16 weight
copy autocast caches 2 = 26 bytes (DDP's gradient buckets add 4 more when trainer.num_workers > 1). A GPU run
also holds the CUDA context and cuBLAS workspaces (1 GiB, added) and loses some memory to allocator
fragmentation (not added: keep 10-20 % headroom). CPU autocast saves the same tensors as CUDA autocast for these
layers (linear, SDPA flash attention, layer norm, GELU) up to dtype choices, so expect +-15 %.

Measured figures replace estimates cell by cell: `--measured bench-*.json` reads the JSON objects `raystream bench
--device cuda --json PATH` writes and shows, in the cell of the same scenario, preset, resolution, frames per clip
and per-GPU batch, "estimate / measured" (measured: `max_memory_allocated` over the live steps, tensors only, so
compare it with the estimate less the 1 GiB of CUDA context). Below the table a line says how many cells are
measured. None is yet: no GPU has been available to this project.
"""

from __future__ import annotations

import argparse
import json
from typing import Dict, List, Sequence, Tuple

BYTES_PER_PARAM = 4 + 4 + 8 + 4 + 4 + 2
CUDA_OVERHEAD = 1 << 30
GIB = float(1 << 30)


def _saved_bytes(model, batch: Dict) -> int:
    """Bytes autograd keeps for backward during one forward pass (each storage counted once)."""
    import torch

    seen: Dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(batch)
    del out
    return sum(seen.values())


def _batch(cfg, b: int) -> Dict:
    import torch

    s = cfg.stream
    shape = (b, int(s.frames_per_clip), int(cfg.scenario.backbone.in_chans), int(s.resolution), int(s.resolution))
    target = None
    if int(s.target_frames) > 0:
        target = torch.rand(b, int(s.target_frames), *shape[2:])
    return {"frames": torch.rand(shape), "target": target, "index": torch.arange(b), "step": 0}


def estimate(overrides: Sequence[str], batches: Sequence[int] = (8, 16, 32, 64)) -> Dict:
    """Parameters, static bytes, activation bytes per clip and the estimated total per per-GPU batch size."""
    import torch

    from raystream.config import compose
    from raystream.models import build_scenario

    cfg = compose(list(overrides))
    model = build_scenario(cfg.scenario, cfg.stream, seed=0).model
    model.train()
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    torch.manual_seed(0)
    a1, a2 = _saved_bytes(model, _batch(cfg, 1)), _saved_bytes(model, _batch(cfg, 2))
    per_clip, fixed = a2 - a1, 2 * a1 - a2
    static = params * BYTES_PER_PARAM + CUDA_OVERHEAD
    return {"params": params, "static": static, "per_clip": per_clip,
            "total": {b: static + max(fixed, 0) + b * per_clip for b in batches},
            "key": (str(cfg.scenario.name), str(cfg.scenario.backbone.preset), int(cfg.stream.resolution),
                    int(cfg.stream.frames_per_clip))}


def measured_peaks(paths: Sequence[str]) -> Dict[Tuple, float]:
    """(scenario, preset, resolution, frames per clip, per-GPU batch) -> peak GiB, from `raystream bench --json`
    files measured on CUDA (CPU runs are left out: their peak is the process's RSS)."""
    out = {}
    for path in paths:
        try:
            with open(path) as f:
                r = json.load(f)
            if r.get("device") == "cuda" and "peak_memory_gb" in r:
                out[(r["scenario"], r["backbone"], r["resolution"], r["frames_per_clip"], r["batch_size"])] = \
                    float(r["peak_memory_gb"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SystemExit(f"--measured {path}: not a `raystream bench --json` output "
                             f"({type(exc).__name__}: {exc})") from None
    return out


def _cell(estimate_bytes: int, measured) -> str:
    return f"{estimate_bytes / GIB:.1f}" + ("" if measured is None else f" / {measured:.1f} measured")


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="videomae_paper")
    p.add_argument("--stream", default="videomae")
    p.add_argument("--presets", nargs="+", default=["small", "base", "large"])
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--batch", nargs="+", type=int, default=[8, 16, 32, 64], help="per-GPU batch sizes")
    p.add_argument("--measured", nargs="*", default=[], metavar="JSON",
                   help="`raystream bench --device cuda --json` outputs whose peaks fill their cells")
    args = p.parse_args(argv)
    measured = measured_peaks(args.measured)
    filled = 0
    print(f"scenario={args.scenario} stream={args.stream} stream.resolution={args.resolution}, bf16 autocast, "
          f"Orthogonal-AdamW; GiB per GPU")
    print("| preset | params | static | per clip | " + " | ".join(f"batch {b}" for b in args.batch) + " |")
    print("|---|---|---|---|" + "---|" * len(args.batch))
    for preset in args.presets:
        r = estimate([f"scenario={args.scenario}", f"stream={args.stream}", f"scenario.backbone.preset={preset}",
                      f"stream.resolution={args.resolution}"], args.batch)
        cells = {b: measured.get((*r["key"], b)) for b in args.batch}
        filled += sum(m is not None for m in cells.values())
        print(f"| {preset} | {r['params'] / 1e6:.1f}M | {r['static'] / GIB:.1f} | {r['per_clip'] / GIB:.3f} | "
              + " | ".join(_cell(r["total"][b], cells[b]) for b in args.batch) + " |")
    print(f"measured by raystream bench: {filled} of {len(args.presets) * len(args.batch)} cells"
          + ("" if filled else " (every figure above is an estimate)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
