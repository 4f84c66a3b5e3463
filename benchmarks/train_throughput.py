"""Training steps per second of the real model and optimizer fed by the live clip stream, against the same steps fed
from memory (the batches decoded beforehand and kept on the device): how much of the device's work the input pipeline
costs. Both orders: sequential (batch_along_time) and shuffled.

    python benchmarks/train_throughput.py                                  # CPU: tiny VideoMAE, 64 px, batch 4
    python benchmarks/train_throughput.py --device cuda --preset vit-s     # ViT-S/16, 224 px, batch 8, bf16
    python benchmarks/train_throughput.py --device cuda --preset vit-b     # ViT-B/16, 224 px, batch 32, bf16

The model is the VideoMAE scenario (16 frames at 12 fps, clips 8 source frames apart) trained with
Orthogonal-AdamW; the stream is raystream's ClipStream behind DeviceStream (uint8 to the device, pinned and copied
a step ahead on CUDA, made float there) with `--decode-workers` decode threads. The video is a walking_tour demo
video (60 fps, x264 crf 23), passes repeated as needed. Each measurement times `--steps` steps after `--warmup`,
from a fresh model; the two feeds alternate `--repeat` times and the fastest run of each is reported.
Target (issue 16): live >= 0.9x from-memory for both orders on a GPU. Imports nothing from Ray, MLflow or Hydra:
the configs are the packages' dataclasses.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_decode import make_video  # noqa: E402 - the same benchmark video generator

PRESETS = {  # backbone preset, stream.resolution, stream.batch_size
    "tiny": ("tiny", 64, 4),
    "vit-s": ("small", 224, 8),
    "vit-b": ("base", 224, 32),
}


def configs(args, order: str, video: str, epochs: int):
    from raystream.data.config import DataConfig, StreamConfig
    from raystream.models.config import BackboneConfig, ScenarioConfig
    from raystream.optim.config import OptimizerConfig

    backbone, resolution, batch = PRESETS[args.preset]
    stream = StreamConfig(order=order, batch_size=args.batch_size or batch, frames_per_clip=16, fps=12.0,
                          clip_shift=8, resolution=args.resolution or resolution, dtype="float", epochs=epochs)
    data = DataConfig(videos=[video], decode_workers=args.decode_workers, decode_timeout_s=600.0)
    return data, stream, ScenarioConfig(name="videomae", backbone=BackboneConfig(preset=backbone)), OptimizerConfig()


def train_steps(args, data, stream_cfg, scenario_cfg, optim_cfg, device, batches=None) -> float:
    """Steps/s over `--steps` steps after `--warmup`, fed by `batches` (on the device) or the live stream."""
    from raystream.data import DeviceStream, build_stream
    from raystream.models import build_scenario
    from raystream.optim import build_optimizer, param_groups

    model = build_scenario(scenario_cfg, stream_cfg, seed=0).model.to(device)
    optimizer = build_optimizer(param_groups(model, optim_cfg), optim_cfg)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext())
    stream = None
    if batches is None:
        stream = DeviceStream(build_stream(data, stream_cfg), device, prefetch=2)
        source = iter(stream)
    else:
        source = iter(batches)
    t0 = None
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            _sync(device)
            t0 = time.perf_counter()
        batch = next(source)
        with autocast:
            loss = model(batch.model_inputs(device))["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    _sync(device)
    seconds = time.perf_counter() - t0
    if stream is not None:
        stream.close()
    return args.steps / seconds


def from_memory(args, data, stream_cfg, device) -> list:
    from raystream.data import DeviceStream, build_stream

    stream = DeviceStream(build_stream(data, stream_cfg), device)
    out = []
    for batch in stream:
        out.append(batch)
        if len(out) == args.warmup + args.steps:
            break
    stream.close()
    return out


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: tiny on CPU, vit-s on CUDA")
    p.add_argument("--batch-size", type=int, default=None, help="override the preset's")
    p.add_argument("--resolution", type=int, default=None, help="override the preset's")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="alternated runs of each; the fastest is reported")
    p.add_argument("--decode-workers", type=int, default=None, help="default: what the CPUs allow")
    p.add_argument("--frames", type=int, default=600, help="frames of the 60 fps benchmark video")
    p.add_argument("--canvas", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    args = p.parse_args()
    device = torch.device(args.device)
    args.preset = args.preset or ("vit-s" if device.type == "cuda" else "tiny")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="raystream-train-bench-") as tmp:
        video = str(make_video(Path(tmp), args.frames, args.canvas))
        clips = max(1, (args.frames - 1 - 15 * 5) // 8 + 1)
        _, _, batch = PRESETS[args.preset]
        per_pass = clips // (args.batch_size or batch)
        epochs = math.ceil((args.warmup + args.steps) / max(1, per_pass))
        print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else os.cpu_count()}"
              f"{'' if device.type == 'cuda' else ' cpus'}); preset {args.preset}; {args.steps} steps after "
              f"{args.warmup}; video {args.frames} frames {args.canvas}px, {epochs} pass(es)")
        print(f"{'order':18} {'from memory it/s':>16} {'live it/s':>10} {'live/memory':>11}")
        for order in ("batch_along_time", "shuffled"):
            data, stream_cfg, scenario_cfg, optim_cfg = configs(args, order, video, epochs)
            memory = from_memory(args, data, stream_cfg, device)
            mem_rate = live_rate = 0.0
            for _ in range(args.repeat):  # alternated, the best of each: a shared machine's load drifts
                mem_rate = max(mem_rate, train_steps(args, data, stream_cfg, scenario_cfg, optim_cfg, device,
                                                     batches=memory))
                live_rate = max(live_rate, train_steps(args, data, stream_cfg, scenario_cfg, optim_cfg, device))
            del memory
            print(f"{order:18} {mem_rate:>16.2f} {live_rate:>10.2f} {live_rate / mem_rate:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
