"""`raystream bench --decoders`: frames per second the clip stream delivers with each installed decoder (torchcodec
on the CPU, decord, PyAV; torchcodec on the GPU where torch sees one), with 1 and 2 decode workers, on a demo video
and on a 1080p H.264 file with B-frames written here with PyAV; which decoder the probe let read each file (a
decoder that would read a file wrong is replaced by the next exact one, and the row says so). Then how decoding
scales with workers: 1, 2, 4, 8 and 16 decode workers (capped at the cores present, and said so), as threads and as
processes (`data.decode_backend`), frames/s and the ratio against one worker of the same kind, and the bytes each
clip is copied on its way to the batch.

    raystream bench --decoders [--json PATH]
    python benchmarks/stream_decode.py --decoders [--frames-1080p 120] [--repeat 3] [--workers 1,2,4,8,16]
        [--backends threads,processes] [--scaling-frames 600] [--scaling-epochs 1] [--json PATH]
    scaling(root, counts=(1, 2, 4, 8, 16), backends=("threads", "processes"))   # the GPU campaign's call

Each row is `build_stream(...).batches()` over every clip (batch_along_time, B=8, 8 frames per clip at 15 fps from
30 fps sources, 224 px, uint8), timed after the probe (readers' opening included), the fastest of `repeat` runs in
this process: wall seconds, and CPU seconds of all the process's threads and of its decode processes (the work,
which a shared machine's load changes much less than the wall time). Decoders are compared within one run: the
ratios are what count. The scaling rows read VideoMAE's clips (16 frames, 15 fps, 8 source frames apart) from a
256 px walking tour with a keyframe every 30 frames, so that every worker has a segment of its own to decode.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from raystream.bench.report import write_json
from raystream.data.config import DataConfig, DemoConfig, StreamConfig
from raystream.data.decode.backends import first_installed, installed_decoders
from raystream.data.decode.torchcodec_reader import cuda_unavailable
from raystream.data.decode.workers import DECODE_BACKENDS, available_cores
from raystream.data.demo.encode import write_video
from raystream.data.demo.render import render_video
from raystream.data.stream.build import build_stream


def write_1080p(path: Path, frames: int = 120) -> Path:
    """`frames` 1920x1080 frames at 30 fps through libx264 with B-frames (bf 3, GOP 30, crf 23): a moving pattern
    with detail, so the decoder has real work per frame."""
    import av  # lazy: only this writer needs PyAV's encoder

    y, x = np.mgrid[0:1080, 0:1920].astype(np.float32)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(30),
                                      options={"crf": "23", "bf": "3", "g": "30", "preset": "veryfast"})
        stream.width, stream.height, stream.pix_fmt = 1920, 1080, "yuv420p"
        for i in range(frames):
            r = (128 + 127 * np.sin((x + 8 * i) / 37.0) * np.cos(y / 23.0)).astype(np.uint8)
            g = ((x * 0.13 + y * 0.07 + 5 * i) % 256).astype(np.uint8)
            b = ((np.hypot(x - 960 - 6 * i, y - 540) / 3) % 256).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(np.stack([r, g, b], axis=-1), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_demo(root: Path, frames: int = 240, gop: Optional[int] = None, name: str = "demo.mp4") -> Path:
    """A demo video (walking_tour, 256 px, 30 fps), as the demo writes it (x264's keyframe interval, or `gop`)."""
    cfg = DemoConfig(kind="walking_tour", num_videos=1, frames_per_video=frames, fps=30.0, canvas=256,
                     objects_per_frame=3, drift_speed=1.0, scene_frames=100, digit_scale=8)
    return write_video(root / name, render_video(cfg, 0), 30.0, crf=23, gop=gop)


CLIPS = {"bench": dict(frames_per_clip=8, fps=15.0, clip_shift=4),  # the per-decoder rows
         "videomae": dict(frames_per_clip=16, fps=15.0, clip_shift=8)}  # the scaling rows


def _children_cpu_s() -> float:
    """CPU seconds of this process's ended children (decode processes, once a stream closed them)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def stream_rate(video: str, decoder: str, device: str, workers: int, repeat: int, resolution: int = 224,
                backend: str = "threads", clips: str = "bench", epochs: int = 1) -> dict:
    """Frames/s of the stream over `video` (the fastest of `repeat` runs; `epochs` passes over the video in
    each), the seconds to its first batch (decode processes start then) and the rate after it (`steady_`: what
    a long run gets), the decoder that read it, and what was copied: `decoded_bytes_per_clip` (decoder's frame ->
    the job's array: shared memory for processes; a frame serving several clips is decoded once) and
    `batch_bytes_per_clip` (that array -> the batch tensor)."""
    data = DataConfig(videos=[video], decoder=decoder, decode_device=device, decode_workers=workers,
                      decode_backend=backend, decode_timeout_s=600.0)
    cfg = StreamConfig(order="batch_along_time", batch_size=8, resolution=resolution, dtype="uint8", epochs=epochs,
                       **CLIPS[clips])
    best, cpu, first, steady, frames, read_by, decoded, clips_seen = (float("inf"), float("inf"), 0.0, 0.0, 0,
                                                                      decoder, 0, 0)
    for _ in range(repeat):
        stream = build_stream(data, cfg)
        read_by = stream.videos[0].decoder(decoder)
        t0, c0, k0, frames, clips_seen = time.perf_counter(), time.process_time(), _children_cpu_s(), 0, 0
        first_frames, t1 = 0, t0
        for batch in stream.batches():
            frames += batch.frames.shape[0] * batch.frames.shape[1]
            clips_seen += batch.frames.shape[0]
            if not first_frames:
                first_frames, t1 = frames, time.perf_counter()
        seconds = time.perf_counter() - t0
        if seconds < best:
            first = t1 - t0
        best = min(best, seconds)
        steady = max(steady, (frames - first_frames) / max(time.perf_counter() - t1, 1e-9))
        cpu = min(cpu, time.process_time() - c0 + _children_cpu_s() - k0)  # the decode processes ended with it
        decoded = stream.frames_decoded
    frame_bytes = 3 * resolution ** 2
    return {"frames": frames, "seconds": best, "first_batch_s": first, "frames_per_s": frames / best,
            "steady_frames_per_s": steady, "cpu_s": cpu,
            "frames_per_cpu_s": frames / cpu, "read_by": read_by, "backend": backend,
            "decoded_bytes_per_clip": decoded * frame_bytes // max(1, clips_seen),
            "batch_bytes_per_clip": frames * frame_bytes // max(1, clips_seen)}


def scaling(root: Path, counts=(1, 2, 4, 8, 16), backends=("threads", "processes"), decoder: str = "auto",
            device: str = "cpu", frames: int = 600, repeat: int = 1, cores: Optional[int] = None,
            epochs: int = 1) -> dict:
    """Frames/s of VideoMAE's clips with each of `counts` decode workers (those above the cores present are left
    out and named in `not_measured`), per backend, and each count's ratio against one worker of its backend (from
    the start, `over_1`, and after the first batch, `steady_over_1`); the fastest of `repeat` rounds, each round
    measuring every row once; `load`: the machine's load average after the fastest run."""
    cores = int(cores or available_cores())
    video = str(write_demo(Path(root), frames, gop=30, name="scaling.mp4"))
    measured = [int(n) for n in counts if int(n) <= cores]
    out: Dict[str, object] = {"cores": cores, "counts": measured, "not_measured": [int(n) for n in counts
                                                                                   if int(n) > cores],
                              "decoder": first_installed(device) if decoder == "auto" else decoder,
                              "device": device, "video_frames": frames, "epochs": epochs, "repeat": repeat,
                              "rows": []}
    runs: Dict[tuple, List[dict]] = {}
    for _ in range(repeat):  # round by round, so that a shared machine's changing load falls on every row alike
        for backend in backends:
            for n in measured:
                r = stream_rate(video, decoder, device, n, 1, backend=backend, clips="videomae", epochs=epochs)
                runs.setdefault((backend, n), []).append({**r, "load": round(os.getloadavg()[0], 2)})
    for backend in backends:
        one = None
        for n in measured:
            r = min(runs[(backend, n)], key=lambda run: run["seconds"])
            r["steady_frames_per_s"] = max(run["steady_frames_per_s"] for run in runs[(backend, n)])
            one = one or r
            out["rows"].append({"backend": backend, "workers": n, "over_1": r["frames_per_s"] / one["frames_per_s"],
                                "steady_over_1": (r["steady_frames_per_s"] / one["steady_frames_per_s"]
                                                  if one["steady_frames_per_s"] else None), **r})
    return out


def rows_to_measure() -> List[tuple]:
    """(label, decoder, device) of every decoder installed here; torchcodec on the GPU where it can."""
    rows = [(("torchcodec cpu" if d == "torchcodec" else d), d, "cpu") for d in installed_decoders()]
    if "torchcodec" in installed_decoders() and cuda_unavailable() is None:
        rows.insert(1, ("torchcodec cuda", "torchcodec", "cuda"))
    return rows


def measure(root: Path, frames_1080p: int = 120, repeat: int = 3, counts=(), backends=("threads", "processes"),
            scaling_frames: int = 600, scaling_epochs: int = 1) -> dict:
    """The per-decoder rows, and with worker `counts` the scaling rows (`scaling`) too."""
    videos = {"demo 256px": str(write_demo(root)), "1080p h264 B-frames": str(write_1080p(root / "1080p.mp4",
                                                                                         frames_1080p))}
    result: Dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "repeat": repeat,
                                 "gpu": cuda_unavailable() or "available", "rows": []}
    for video_name, path in videos.items():
        for label, decoder, device in rows_to_measure():
            for workers in (1, 2):
                r = stream_rate(path, decoder, device, workers, repeat)
                result["rows"].append({"video": video_name, "decoder": label, "workers": workers, **r})
    fastest = {}
    for row in result["rows"]:
        if row["read_by"] == row["decoder"].split()[0] and row["frames_per_s"] > fastest.get(row["video"], (0, ""))[0]:
            fastest[row["video"]] = (row["frames_per_s"], f"{row['decoder']} w{row['workers']}")
    result["fastest_exact"] = {v: name for v, (_, name) in fastest.items()}
    if counts and backends:
        result["scaling"] = scaling(root, counts, backends, frames=scaling_frames, repeat=repeat,
                                    epochs=scaling_epochs)
    return result


def print_table(result: dict) -> None:
    print(f"decoders, {result['date']}; GPU: {result['gpu']}; best of {result['repeat']}; stream: B=8, 8 frames "
          f"per clip, 224 px")
    print(f"{'video':22} {'decoder':16} {'workers':>7} {'frames':>7} {'s':>7} {'frames/s':>9} {'cpu s':>7} "
          f"{'f/cpu-s':>8}  read by")
    for r in result["rows"]:
        print(f"{r['video']:22} {r['decoder']:16} {r['workers']:>7} {r['frames']:>7} {r['seconds']:>7.2f} "
              f"{r['frames_per_s']:>9.0f} {r['cpu_s']:>7.2f} {r['frames_per_cpu_s']:>8.0f}  {r['read_by']}")
    for video, name in result["fastest_exact"].items():
        print(f"fastest exact on {video}: {name}")
    if "scaling" in result:
        print_scaling(result["scaling"])


def print_scaling(sc: dict) -> None:
    left = (f"; {sc['not_measured']} workers not measured: {sc['cores']} cores here" if sc["not_measured"] else "")
    print(f"\nscaling: {sc['decoder']} on {sc['device']}, VideoMAE clips (16 frames) of a {sc['video_frames']}-frame "
          f"256 px video with a keyframe every 30 frames, {sc['epochs']} pass(es), best of {sc['repeat']}{left}")
    print(f"{'backend':10} {'workers':>7} {'frames':>7} {'s':>7} {'1st s':>6} {'frames/s':>9} {'vs 1':>6} "
          f"{'steady':>7} {'vs 1':>6} {'f/cpu-s':>8} {'decoded B/clip':>14} {'batch B/clip':>12} {'load':>6}")
    for r in sc["rows"]:
        print(f"{r['backend']:10} {r['workers']:>7} {r['frames']:>7} {r['seconds']:>7.2f} {r['first_batch_s']:>6.2f} "
              f"{r['frames_per_s']:>9.0f} {r['over_1']:>5.2f}x {r['steady_frames_per_s']:>7.0f} "
              + (f"{r['steady_over_1']:>5.2f}x " if r["steady_over_1"] is not None else f"{'-':>6} ")
              + f"{r['frames_per_cpu_s']:>8.0f} {r['decoded_bytes_per_clip']:>14,} {r['batch_bytes_per_clip']:>12,} "
              f"{r['load']:>6}")
    print("copies: the decoder's frame is cropped into the job's array (shared memory for processes) once per "
          "decoded frame, then each clip's frames are copied into the batch tensor")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames-1080p", type=int, default=120, help="frames of the 1080p H.264 video (default 120)")
    p.add_argument("--repeat", type=int, default=3, help="passes per row; the fastest is reported (default 3)")
    p.add_argument("--workers", default="1,2,4,8,16", help="decode worker counts of the scaling rows, capped at "
                   "the cores present (default 1,2,4,8,16; empty: no scaling rows)")
    p.add_argument("--backends", default="threads,processes", help="data.decode_backend values of the scaling rows")
    p.add_argument("--scaling-frames", type=int, default=600, help="frames of the scaling rows' video (default 600)")
    p.add_argument("--scaling-epochs", type=int, default=1, help="passes over that video per row (default 1)")
    p.add_argument("--scaling-only", action="store_true", help="only the scaling rows")
    p.add_argument("--json", default=None, metavar="PATH", help="write the result as one JSON object")
    args = p.parse_args(argv)
    try:
        counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        p.error(f"--workers {args.workers!r}: expected decode worker counts separated by commas, e.g. 1,2,4,8,16")
    if any(n < 1 for n in counts):
        p.error(f"--workers {args.workers!r}: every count must be at least 1")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in DECODE_BACKENDS]
    if bad:
        p.error(f"--backends {args.backends!r}: {bad} not among {', '.join(DECODE_BACKENDS)}")
    with tempfile.TemporaryDirectory(prefix="raystream-decoders-") as tmp:
        if args.scaling_only:
            result = {"date": time.strftime("%Y-%m-%d %H:%M"), "scaling": scaling(
                Path(tmp), counts, backends, frames=args.scaling_frames, repeat=args.repeat,
                epochs=args.scaling_epochs)}
            print_scaling(result["scaling"])
        else:
            result = measure(Path(tmp), args.frames_1080p, args.repeat, counts, backends, args.scaling_frames,
                             args.scaling_epochs)
            print_table(result)
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
