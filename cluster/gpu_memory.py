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
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Sequence

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
            "total": {b: static + max(fixed, 0) + b * per_clip for b in batches}}


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="videomae_paper")
    p.add_argument("--stream", default="videomae")
    p.add_argument("--presets", nargs="+", default=["small", "base", "large"])
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--batch", nargs="+", type=int, default=[8, 16, 32, 64], help="per-GPU batch sizes")
    args = p.parse_args(argv)
    print(f"scenario={args.scenario} stream={args.stream} stream.resolution={args.resolution}, bf16 autocast, "
          f"Orthogonal-AdamW; GiB per GPU")
    print("| preset | params | static | per clip | " + " | ".join(f"batch {b}" for b in args.batch) + " |")
    print("|---|---|---|---|" + "---|" * len(args.batch))
    for preset in args.presets:
        r = estimate([f"scenario={args.scenario}", f"stream={args.stream}", f"scenario.backbone.preset={preset}",
                      f"stream.resolution={args.resolution}"], args.batch)
        print(f"| {preset} | {r['params'] / 1e6:.1f}M | {r['static'] / GIB:.1f} | {r['per_clip'] / GIB:.3f} | "
              + " | ".join(f"{r['total'][b] / GIB:.1f}" for b in args.batch) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
