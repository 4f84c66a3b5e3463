"""The GPU campaign: everything raystream claims about GPUs, measured in one command on one GPU, written as one JSON
file and one Markdown table. `benchmarks/gpu_campaign.sh` runs it on the GPU machine; `benchmarks/gpu_campaign_pack.sh`
gathers here what that machine lacks (docs/benchmarks.md, "The GPU campaign").

    python -m raystream.bench.campaign --out DIR [--device cuda|cpu] [--tiny] [--budget 420] [--demo-dir DIR]
                                       [--presets NAME,NAME,...]   # which presets, in that order (default: all)
                                       [--peak-tflops T]           # the device's dense bf16 peak, for MFU
                                       [--optimizer-compile on|off]  # also Orthogonal-AdamW's compiled step
    python -m raystream.bench.campaign --prepare [--tiny] [--demo-dir DIR]   # the demo videos it reads (PyAV)

For each paper preset (future prediction ViT-L/16 first, then DoRA ViT-S/16 and VideoMAE ViT-B/16) at its
per-GPU batch:
  bench     `raystream bench`'s measurement (main.py `run`): the model FLOPs per step (flops.py) and steps/s from
            device memory with the model's blocks eager and compiled (`trainer.compile`, on CUDA; their peak memory),
            from the live stream, each with its achieved TFLOP/s and MFU; the optimizer step (every variant
            optimizer_timing.py times: the configured one, Orthogonal-AdamW's fused and multi-tensor steps where
            they run, AdamW foreach and fused; the compiled Orthogonal-AdamW with --optimizer-compile on), the
            checks before timing, the peak memory of the correlation and of the steps with a checkpoint save;
  estimate  cluster/gpu_memory.py's estimate at the same per-GPU batch, beside the measured peak;
  train     2 steps as a worker takes them, one log window (worker_steps.py): host syncs in the steps and at the
            read-back, the checkpoint's save stall (copy to host memory) and its write.
Then:
  decode    frames/s of the clip stream per decoder that imports here (backends.DECODERS), measured by
            benchmarks/stream_decode.py's `child` on a video it writes;
  gpu_decode  on CUDA only: `raystream bench --decoders` (decoders.py `measure`: each decoder, torchcodec on NVDEC
            where it loads, 1 and 2 decode workers, a 256 px demo video and a 1080p H.264 file with B-frames; then
            the decode-worker scaling, DECODE_SCALING: 1, 2, 4, 8, 16 workers as threads and as processes), and
            whether NVDEC decoded frames into device memory (torchcodec's CPU-fallback status);
  eval      bf16 feature extraction (eval_rates.py `encode_rate`): ViT-S/16 images/s at 224 px, ViT-B/16 clips/s.

Every phase draws on one time budget (default 420 s: with the wheels' install and the phases' overrun, one device
call of under 9 minutes); the presets may spend all but RESERVE of it, so that the phases after them run. A phase
that fails is recorded with its error and the others go on. `--tiny` (the CPU dry run of the suite) takes the same
path with tiny models, 32 px clips, batch 2 and no compiling. Imports neither Ray nor MLflow. Exit 0, or 1 when a
phase failed (the JSON says which). campaign_table.py writes the Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from raystream.bench.campaign_table import markdown
from raystream.bench.eval_rates import encode_rate
from raystream.bench.main import run as bench_run
from raystream.bench.worker_steps import train_steps
from raystream.config import compose
from raystream.data.decode.backends import DECODERS, installed_decoders, open_reader
from raystream.data.demo.videos import ensure_demo_videos
from raystream.models.vit import VisionTransformer

ROOT = Path(__file__).resolve().parents[2]
DEMO_DIR = ".campaign/demo"

# The paper presets at their per-GPU batch (the experiment's global batch over its GPUs), in the order measured
# (the largest model first: a budget that ends early skips the last): future prediction 16 on one GPU, DoRA 32 clips
# on one, VideoMAE 512 over 8 GPUs (64 each: one GPU's rank, world 1, so that the 2 demo videos fill its batch).
PRESETS = {
    "future_prediction_vit_l": ["+experiment=future_prediction_paper", "trainer.num_workers=1",
                                "stream.batch_size=16"],
    "dora_vit_s": ["+experiment=dora_paper", "trainer.num_workers=1", "stream.batch_size=32"],
    "videomae_vit_b": ["+experiment=videomae_paper", "trainer.num_workers=1", "stream.batch_size=64"],
}
# What every preset reads: demo walking-tour videos (the paper's videos are not on the GPU machine), no probe sets.
DEMO = ["data=walking_tour", "data.videos=null", "data.heldout_videos=null", "eval.dataset=null", "eval.metrics=[]",
        "data.demo.num_videos=2", "data.demo.frames_per_video=900", "data.demo.canvas=256"]
# --tiny: the same presets shrunk so that the whole campaign runs on a CPU in the suite.
TINY = ["scenario.backbone.preset=tiny", "stream.resolution=32", "stream.batch_size=2", "trainer.num_workers=1",
        "data.demo.num_videos=1", "data.demo.frames_per_video=150", "data.demo.canvas=32", "trainer.bf16=false"]
TINY_PRESET = {
    "dora_vit_s": ["stream.fps=10", "scenario.dora.out_dim=64", "scenario.dora.hidden_dim=32",
                   "scenario.dora.bottleneck_dim=16", "scenario.dora.local_size=16", "scenario.dora.local_crops=2"],
    "videomae_vit_b": ["stream.frames_per_clip=4"],
    "future_prediction_vit_l": ["stream.target_offset_s=0.2"],
}
BUDGET = {"bench": 0.18}  # each preset's bench: this share of the whole budget at most
RESERVE = 0.25  # the share of the budget kept for the phases after the presets (decoders, evaluation)
# The decode-worker scaling gpu_decode measures (decoders.py `scaling`: VideoMAE's clips with each count of decode
# workers per backend, counts above the machine's cores left out): whether N workers deliver close to N times one.
DECODE_SCALING = {"counts": (1, 2, 4, 8, 16), "backends": ("threads", "processes")}
SCALING_MIN_S = 45.0  # the budget left that the scaling rows need (10 passes over a 600-frame video)


def overrides(preset: str, tiny: bool, demo_dir: str) -> List[str]:
    return [*PRESETS[preset], *DEMO, f"data.demo.cache_dir={demo_dir}",
            *((TINY + TINY_PRESET[preset]) if tiny else [])]


def _gpu_memory():
    """cluster/gpu_memory.py (a script folder, not a package), loaded from the checkout."""
    spec = importlib.util.spec_from_file_location("raystream_cluster_gpu_memory", ROOT / "cluster" / "gpu_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stream_decode():
    spec = importlib.util.spec_from_file_location("raystream_stream_decode", ROOT / "benchmarks" / "stream_decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Campaign:
    """The phases in order, each recorded under its name in `result` (its figures, or `{"error": ...}`)."""

    def __init__(self, device: str, tiny: bool, budget_s: float, demo_dir: str, presets: Optional[List[str]] = None,
                 peak_tflops: Optional[float] = None, optimizer_compile: str = "off"):
        self.device, self.tiny, self.demo_dir = device, tiny, demo_dir
        self.peak_tflops, self.optimizer_compile = peak_tflops, optimizer_compile
        self.presets = list(presets or PRESETS)
        self.budget_s, self.started = float(budget_s), time.monotonic()
        self.result: Dict[str, Any] = {
            "device": device, "tiny": tiny, "torch": torch.__version__, "budget_s": self.budget_s,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "commit": _commit(demo_dir), "presets": {}, "failed": []}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def phase(self, where: Dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
        """Run one phase; record its figures and seconds, or its error (the campaign goes on)."""
        t0 = time.monotonic()
        try:
            where[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one phase's failure is a figure of the campaign, not its end
            where[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=4)}
            self.result["failed"].append(name if where is self.result else f"{where['preset']}.{name}")
        where.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 2)
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        return where[name]

    def preset(self, name: str) -> None:
        ov = overrides(name, self.tiny, self.demo_dir)
        cfg = compose(ov)
        where = self.result["presets"].setdefault(name, {"preset": name, "overrides": ov,
                                                         "stream_order": str(cfg.stream.order)})
        budget = max(30.0, min(self.left() - RESERVE * self.budget_s, BUDGET["bench"] * self.budget_s))
        # the model compiled against eager (on CUDA: regional, seconds); Orthogonal-AdamW's compiled step only when
        # asked (--optimizer-compile on): slower than the eager one on the H200 and minutes to compile (2026-11-27)
        self.phase(where, "bench", lambda: bench_run(
            cfg, device=self.device, steps=2 if self.tiny else 10, time_budget=budget,
            compile="off" if self.tiny else self.optimizer_compile, model_compile="off" if self.tiny else "on",
            overrides=ov, peak_tflops=self.peak_tflops))
        batch = int(cfg.stream.batch_size) // int(cfg.trainer.num_workers)
        self.phase(where, "estimate", lambda: _estimate(ov, batch))
        self.phase(where, "train", lambda: train_steps(cfg, torch.device(self.device), steps=2))

    def decode(self) -> Dict[str, Any]:
        bench = _stream_decode()
        frames, canvas, resolution = (150, 64, 32) if self.tiny else (900, 256, 224)
        out: Dict[str, Any] = {"video_frames": frames, "canvas": canvas, "resolution": resolution, "decoders": {}}
        with tempfile.TemporaryDirectory(prefix="raystream-campaign-video-") as d:
            video = str(bench.make_video(Path(d), frames, canvas))
            # Each decoder's first open in a process loads its library (torchcodec's CUDA build: seconds), once per
            # decode worker: timed apart, so that the first row measured (auto's) is a rate like the others.
            out["first_open_s"] = {}
            for decoder in installed_decoders():
                t0 = time.perf_counter()
                open_reader(video, decoder).close()
                out["first_open_s"][decoder] = round(time.perf_counter() - t0, 3)
            for decoder in DECODERS:
                for setting in ("videomae",) if self.tiny else ("dora", "videomae"):
                    key = f"{setting} {decoder}"
                    if self.left() < 10:
                        out["decoders"][key] = {"skipped": "time budget"}
                        continue
                    try:
                        r = bench.child("stream", video, setting, decoder, resolution, 0)
                        out["decoders"][key] = {"frames": r["frames"], "seconds": r["seconds"],
                                                "frames_per_s": r["frames"] / r["seconds"]}
                    except Exception as exc:  # noqa: BLE001 - a decoder not installed here is a row, not a failure
                        out["decoders"][key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        return out

    def gpu_decode(self) -> Dict[str, Any]:
        from raystream.bench import decoders  # lazy: writes its videos with PyAV, on CUDA only
        from raystream.data.decode.torchcodec_reader import TorchCodecReader, cuda_unavailable  # lazy: as above

        why = cuda_unavailable()
        out: Dict[str, Any] = {"gpu": why or "available"}
        with tempfile.TemporaryDirectory(prefix="raystream-campaign-decoders-") as d:
            if why is None:
                reader = TorchCodecReader(str(decoders.write_1080p(Path(d) / "probe.mp4", 30)), size=(398, 224),
                                          device="cuda")
                frames = reader.get([0, 17, 29])
                import torchcodec  # lazy: loaded by the reader just above

                out["nvdec"] = {"frames_device": str(frames.device), "shape": list(frames.shape),
                                "cpu_fallback": reader.cpu_fallback or "none",
                                "torchcodec": torchcodec.__version__}
                reader.close()
            scaling = DECODE_SCALING if self.left() >= SCALING_MIN_S else {"counts": ()}
            if not scaling["counts"]:
                out["scaling_skipped"] = f"time budget: {self.left():.0f} s left < {SCALING_MIN_S:.0f} s"
            out.update(decoders.measure(Path(d), frames_1080p=120, repeat=1, **scaling))
        return out

    def eval(self) -> Dict[str, Any]:
        dev = torch.device(self.device)
        if self.tiny:
            side, images, clips, frames, dims = 32, 4, 2, 4, dict(embed_dim=32, depth=1, num_heads=2)
            vit_s = vit_b = dims
        else:
            side, images, clips, frames = 224, 256, 32, 16
            vit_s, vit_b = dict(embed_dim=384, depth=12, num_heads=6), dict(embed_dim=768, depth=12, num_heads=12)
        s = VisionTransformer(img_size=side, patch_size=16, **vit_s).to(dev).eval()
        b = VisionTransformer(img_size=side, patch_size=16, num_frames=frames, tubelet_size=2, **vit_b).to(dev).eval()
        batches = 1 if self.tiny else 3
        return {"bf16": dev.type == "cuda", "resolution": side, "image_batch": images, "clip_batch": clips,
                "vit_s16_images_per_s": encode_rate(s, (3, side, side), images, batches, dev),
                "vit_b16_clips_per_s": encode_rate(b, (frames, 3, side, side), clips, batches, dev)}

    def run(self) -> Dict[str, Any]:
        for name in self.presets:  # the largest first; RESERVE of the budget is kept for the phases after them
            if self.left() - RESERVE * self.budget_s <= 30:
                self.result["presets"][name] = {"preset": name, "skipped": "time budget"}
                continue
            self.preset(name)
        # The decode-worker scaling (decoders.py `measure`, at the worker counts it measures) comes right after the
        # presets: the live stream's rates above are read against it.
        if self.device == "cuda":
            self.phase(self.result, "gpu_decode", self.gpu_decode)
        else:  # the suite measures decoders.py on the CPU (tests/bench/test_bench_decoders.py)
            self.result["gpu_decode"] = {"skipped": "no CUDA device"}
        self.phase(self.result, "decode", self.decode)
        self.phase(self.result, "eval", self.eval)
        self.result["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.result["imported"] = sorted(m for m in ("ray", "mlflow") if m in sys.modules)  # none: a bare GPU box
        return self.result


def _estimate(ov: List[str], batch: int) -> Dict[str, Any]:
    r = _gpu_memory().estimate(ov, [batch])
    return {"batch": batch, "tensors_bytes": r["tensors"][batch], "total_bytes": r["total"][batch],
            "moments_bytes": r["moments"][batch], "params": r["params"]}


def _commit(demo_dir: str = DEMO_DIR) -> Optional[str]:
    """The checkout's commit: git's, or the one gpu_campaign_pack.sh wrote beside the demo videos (a copy of the
    working tree on the GPU machine may have no .git)."""
    try:
        found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        found = ""
    packed = ROOT / Path(demo_dir).parent / "commit"
    return found or (packed.read_text().strip() if packed.is_file() else None)


def prepare(tiny: bool, demo_dir: str) -> List[str]:
    """Write the demo videos every preset reads into `demo_dir` (the campaign's overrides find them there)."""
    written = []
    for name in PRESETS:
        cfg = compose(overrides(name, tiny, demo_dir))
        written += [str(p) for p in ensure_demo_videos(cfg.data.demo)]
    return sorted(set(written))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for campaign.json and campaign.md")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when torch sees a GPU")
    p.add_argument("--tiny", action="store_true", help="tiny models and clips: the CPU dry run")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for the whole campaign")
    p.add_argument("--demo-dir", default=DEMO_DIR, help="where the demo videos are (or are written)")
    p.add_argument("--prepare", action="store_true", help="only write the demo videos into --demo-dir")
    p.add_argument("--presets", default=",".join(PRESETS),
                   help="the presets to measure, in this order (comma-separated; default: all, as listed in PRESETS)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense bf16 peak in TFLOP/s, for MFU (default: flops.py's table of known GPUs)")
    p.add_argument("--optimizer-compile", choices=["on", "off"], default="off",
                   help="also time and check Orthogonal-AdamW's compiled step (minutes of compiling per preset)")
    args = p.parse_args(argv)
    if args.prepare:
        for path in prepare(args.tiny, args.demo_dir):
            print(path)
        return 0
    if args.out is None:
        p.error("--out is required (unless --prepare)")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print(f"raystream campaign: --device cuda but torch {torch.__version__} sees no GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    presets = [name for name in args.presets.split(",") if name]
    unknown = [name for name in presets if name not in PRESETS]
    if unknown:
        p.error(f"--presets: unknown {', '.join(unknown)} (expected some of {', '.join(PRESETS)})")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        p.error(f"--peak-tflops {args.peak_tflops}: expected a peak > 0 (TFLOP/s)")
    result = Campaign(device, args.tiny, args.budget, args.demo_dir, presets, args.peak_tflops,
                      args.optimizer_compile).run()
    (out / "campaign.json").write_text(json.dumps(result, indent=1, default=str))
    table = markdown(result)
    (out / "campaign.md").write_text(table)
    print(table)
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
