"""`raystream bench --decoders`: frames per second the clip stream delivers with each installed decoder (torchcodec
on the CPU, decord, PyAV; torchcodec on the GPU where torch sees one), with 1 and 2 decode workers, on a demo video
and on a 1080p H.264 file with B-frames written here with PyAV; which decoder the probe let read each file (a
decoder that would read a file wrong is replaced by the next exact one, and the row says so).

    raystream bench --decoders [--json PATH]
    python benchmarks/stream_decode.py --decoders [--frames-1080p 120] [--repeat 3] [--json PATH]

Each row is `build_stream(...).batches()` over every clip (batch_along_time, B=8, 8 frames per clip at 15 fps from
30 fps sources, 224 px, uint8), timed after the probe (readers' opening included), the fastest of `repeat` runs in
this process: wall seconds, and CPU seconds of all the process's threads (the work, which a shared machine's load
changes much less than the wall time). Decoders are compared within one run: the ratios are what count.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from raystream.bench.report import write_json
from raystream.data.config import DataConfig, DemoConfig, StreamConfig
from raystream.data.decode.backends import installed_decoders
from raystream.data.decode.torchcodec_reader import cuda_unavailable
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


def write_demo(root: Path, frames: int = 240) -> Path:
    """A demo video (walking_tour, 256 px, 30 fps), as the demo writes it."""
    cfg = DemoConfig(kind="walking_tour", num_videos=1, frames_per_video=frames, fps=30.0, canvas=256,
                     objects_per_frame=3, drift_speed=1.0, scene_frames=100, digit_scale=8)
    return write_video(root / "demo.mp4", render_video(cfg, 0), 30.0, crf=23)


def stream_rate(video: str, decoder: str, device: str, workers: int, repeat: int, resolution: int = 224) -> dict:
    """Frames/s of the stream over `video` (the fastest of `repeat` passes) and the decoder that read it."""
    data = DataConfig(videos=[video], decoder=decoder, decode_device=device, decode_workers=workers,
                      decode_timeout_s=600.0)
    cfg = StreamConfig(order="batch_along_time", batch_size=8, frames_per_clip=8, fps=15.0, clip_shift=4,
                       resolution=resolution, dtype="uint8")
    best, cpu, frames, read_by = float("inf"), float("inf"), 0, decoder
    for _ in range(repeat):
        stream = build_stream(data, cfg)
        read_by = stream.videos[0].decoder(decoder)
        t0, c0, frames = time.perf_counter(), time.process_time(), 0
        for batch in stream.batches():
            frames += batch.frames.shape[0] * batch.frames.shape[1]
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return {"frames": frames, "seconds": best, "frames_per_s": frames / best, "cpu_s": cpu,
            "frames_per_cpu_s": frames / cpu, "read_by": read_by}


def rows_to_measure() -> List[tuple]:
    """(label, decoder, device) of every decoder installed here; torchcodec on the GPU where it can."""
    rows = [(("torchcodec cpu" if d == "torchcodec" else d), d, "cpu") for d in installed_decoders()]
    if "torchcodec" in installed_decoders() and cuda_unavailable() is None:
        rows.insert(1, ("torchcodec cuda", "torchcodec", "cuda"))
    return rows


def measure(root: Path, frames_1080p: int = 120, repeat: int = 3) -> dict:
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


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames-1080p", type=int, default=120, help="frames of the 1080p H.264 video (default 120)")
    p.add_argument("--repeat", type=int, default=3, help="passes per row; the fastest is reported (default 3)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the result as one JSON object")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="raystream-decoders-") as tmp:
        result = measure(Path(tmp), args.frames_1080p, args.repeat)
    print_table(result)
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
