"""`raystream bench --eval`: what one evaluation worker does per second, and what the paper's two probe evaluations
cost from those rates.

    raystream bench --eval [--device cpu|cuda] [--json PATH]
    python benchmarks/eval_extraction.py [--device cpu|cuda] [--threads 1] [--batches 3] [--json PATH]

Measured (no Ray, MLflow or Hydra; one worker = this process; CPU: `--threads` torch threads, fp32; CUDA: bf16
autocast, as raystream/eval/probes.py extracts):
- images/s: ViT-S/16 at 224 px encoding images (the [CLS] DINO's kNN and linear probe read), batches of
  `--image-batch` (8 on CPU, 256 on CUDA);
- clips/s: ViT-B/16 (tubelet 2) encoding clips of 16 frames at 224 px (the tokens V-JEPA's attentive probe reads),
  batches of `--clip-batch` (2 on CPU, 32 on CUDA);
- DINO's centre view of a 500 x 375 JPEG (decode, bicubic resize to 256, crop 224: raystream/eval/views.py), ms;
- one attentive-probe step (raystream/eval/attentive.py) at batch 32 on ViT-B tokens of 16-frame clips (1568 x 768),
  forward, backward and AdamW, s.
Each rate is the median over `--batches` timed batches after one untimed one.

Estimated from them (not measured end to end; on a GPU this script fills in the GPU figures):
- DINO protocol, ViT-S on ImageNet (Table 1): every image encoded once for kNN (1,281,167 train + 50,000 val), and
  once per epoch for the augmented linear probe (100 epochs): 129.4M image forwards, plus as many JPEG views (which
  the data-loading CPUs prepare beside the GPU);
- V-JEPA protocol, ViT-B on SSv2 (Table 2): every clip encoded once (168,913 train + 24,777 validation) and 40,000
  attentive-probe steps at batch 32 on the cached tokens (the linear probe beside it costs nothing in comparison).
Worker-hours divide by the workers: extraction and the probes' mini-batches split over them (raystream eval).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
from PIL import Image

from raystream.bench.report import write_json
from raystream.eval.attentive import AttentiveClassifier
from raystream.eval.views import image_view
from raystream.models.vit import VisionTransformer

IMAGENET_TRAIN, IMAGENET_VAL, DINO_EPOCHS = 1_281_167, 50_000, 100
SSV2_TRAIN, SSV2_VAL, VJEPA_STEPS, VJEPA_BATCH = 168_913, 24_777, 40_000, 32


def _timed(fn, batches: int, device: torch.device) -> float:
    """Median seconds of `fn()` over `batches` calls, after one untimed call."""
    fn()
    out = []
    for _ in range(batches):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def encode_rate(vit, shape, batch: int, batches: int, device: torch.device) -> float:
    """Inputs per second `vit` encodes (no gradients; bf16 autocast on CUDA)."""
    x = torch.rand(batch, *shape, device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    def run():
        with torch.no_grad(), autocast:
            vit(x)

    return batch / _timed(run, batches, device)


def view_ms(batches: int) -> float:
    """Milliseconds of DINO's centre view of one 500 x 375 JPEG (PIL decode, resize, crop)."""
    buffer = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (375, 500, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()

    def run():
        for _ in range(10):
            with Image.open(io.BytesIO(data)) as im:
                image_view(im, "centre", 256, 224, rng)

    return 100.0 * _timed(run, batches, torch.device("cpu"))


def attentive_step_s(batches: int, device: torch.device) -> float:
    """Seconds of one attentive-probe step at V-JEPA's batch on ViT-B tokens of a 16-frame clip."""
    probe = AttentiveClassifier(768, 174, num_heads=12).to(device)
    opt = torch.optim.AdamW(probe.parameters(), lr=3e-4, weight_decay=0.0)
    tokens = torch.randn(VJEPA_BATCH, 8 * 14 * 14, 768, device=device)
    labels = torch.randint(0, 174, (VJEPA_BATCH,), device=device)

    def run():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(probe(tokens), labels).backward()
        opt.step()

    return _timed(run, batches, device)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when torch sees a GPU")
    p.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1: one worker's)")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--image-batch", type=int, default=None)
    p.add_argument("--clip-batch", type=int, default=None)
    p.add_argument("--json", default=None)
    return p


def main(argv=None) -> int:
    """Measure, print the rates and the estimates, write the JSON. Exit 0, or 2 for a device torch does not see."""
    args = parser().parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("raystream bench --eval: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    gpu = device.type == "cuda"
    image_batch = args.image_batch or (256 if gpu else 8)
    clip_batch = args.clip_batch or (32 if gpu else 2)
    vit_s = VisionTransformer(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6).to(device).eval()
    vit_b = VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_frames=16,
                              tubelet_size=2).to(device).eval()
    images_s = encode_rate(vit_s, (3, 224, 224), image_batch, args.batches, device)
    clips_s = encode_rate(vit_b, (16, 3, 224, 224), clip_batch, args.batches, device)
    jpeg_ms = view_ms(args.batches)
    step_s = attentive_step_s(args.batches, device)

    dino_forwards = IMAGENET_TRAIN * (1 + DINO_EPOCHS) + IMAGENET_VAL
    vjepa_clips = SSV2_TRAIN + SSV2_VAL
    result = {
        "device": torch.cuda.get_device_name() if gpu else f"cpu, {args.threads} thread(s)",
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
        "measured": {"vit_s16_images_per_s": images_s, "vit_b16_clips16_per_s": clips_s,
                     "dino_jpeg_view_ms": jpeg_ms, "attentive_step_b32_vit_b_s": step_s,
                     "image_batch": image_batch, "clip_batch": clip_batch},
        "estimated_worker_hours": {
            "dino_vit_s_imagenet": {"encode": dino_forwards / images_s / 3600,
                                    "jpeg_views_cpu": dino_forwards * jpeg_ms / 1000 / 3600},
            "vjepa_vit_b_ssv2": {"encode": vjepa_clips / clips_s / 3600,
                                 "attentive_probe": VJEPA_STEPS * step_s / 3600}},
    }
    m, e = result["measured"], result["estimated_worker_hours"]
    print(f"evaluation worker on {result['device']}, torch {result['torch']}, {result['date']} "
          f"(median of {args.batches} batches)")
    print(f"  ViT-S/16 224 px       {m['vit_s16_images_per_s']:10.2f} images/s  (batch {image_batch})")
    print(f"  ViT-B/16 16x224 px    {m['vit_b16_clips16_per_s']:10.3f} clips/s   (batch {clip_batch})")
    print(f"  DINO view of a JPEG   {m['dino_jpeg_view_ms']:10.2f} ms (CPU)")
    print(f"  attentive probe step  {m['attentive_step_b32_vit_b_s']:10.3f} s (batch 32, ViT-B tokens)")
    print("estimated, worker-hours (divide by the workers):")
    d, v = e["dino_vit_s_imagenet"], e["vjepa_vit_b_ssv2"]
    print(f"  DINO protocol, ViT-S, ImageNet:  encode {d['encode']:12.1f}  (+ JPEG views {d['jpeg_views_cpu']:.1f} "
          "CPU-hours beside it)")
    print(f"  V-JEPA protocol, ViT-B, SSv2:    encode {v['encode']:12.1f}  + attentive probe "
          f"{v['attentive_probe']:.1f}")
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
