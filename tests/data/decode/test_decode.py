"""Decoding: frames scaled inside the decoder agree with the PIL reference; decode workers, the segment plan and the
device prefetcher never change which frames a batch holds (for every order, and after a restore)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from rs_data_helpers import data_cfg, stream_cfg

from raystream.data import DataError, build_stream
from raystream.data.config import DATA_CHECKS, DataConfig
from raystream.data.decode.backends import open_reader, open_scaled_reader
from raystream.data.decode.frames import crop_square, scaled_size, square_resize
from raystream.data.decode.plan import Plan, Segments
from raystream.data.demo.encode import write_video
from raystream.data.stream.device import DeviceStream
from raystream.data.stream.orders import ORDERS, Order
from raystream.data.videos.listing import VideoInfo

SETTINGS = {
    "overlap": dict(frames_per_clip=3, fps=15.0, clip_shift=1),
    "future": dict(frames_per_clip=2, fps=15.0, clip_shift=2, target_frames=2, target_offset_s=0.1),
}


def _all(stream, start=0):
    return [(b.step, b.clips, b.frames, b.target) for b in stream.batches(start)]


def _same(a, b):
    assert len(a) == len(b) > 0
    for (s, c, f, t), (s2, c2, f2, t2) in zip(a, b):
        assert (s, c) == (s2, c2) and torch.equal(f, f2)
        assert (t is None and t2 is None) or torch.equal(t, t2)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("order", ORDERS)
def test_decode_workers_do_not_change_the_batches_nor_a_restore(block_videos, order, setting):
    s = stream_cfg(order=order, batch_size=2, epochs=2, **SETTINGS[setting])
    base = _all(build_stream(data_cfg(block_videos, decode_workers=1), s, rank=1, world_size=2))
    cut = len(base) // 2 + 1
    for workers in (2, 3):
        for read_ahead in (True, False):
            d = data_cfg(block_videos, decode_workers=workers, read_ahead=read_ahead, shuffle_horizon=workers)
            _same(base, _all(build_stream(d, s, rank=1, world_size=2)))
        # stopped mid-stream with one worker count, restored with another
        stream = build_stream(data_cfg(block_videos, decode_workers=workers), s, rank=1, world_size=2)
        it = iter(stream)
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(stream.state_dict()))
        stream.close()
        restored = build_stream(data_cfg(block_videos, decode_workers=5 - workers, prefetch=0), s, rank=1,
                                world_size=2)
        restored.load_state_dict(state)
        _same(base[cut:], [(b.step, b.clips, b.frames, b.target) for b in restored])


def _smooth_video(path, width, height, frames=12):
    from raystream.data.config import DemoConfig
    from raystream.data.demo.render import render_video

    side = max(width, height)
    cfg = DemoConfig(kind="walking_tour", num_videos=1, frames_per_video=frames, fps=30.0, canvas=side)
    top, left = (side - height) // 2, (side - width) // 2
    pixels = (f[top:top + height, left:left + width] for f in render_video(cfg, 0))
    return str(write_video(path, pixels, 30.0, crf=0, gop=5))


@pytest.mark.parametrize("decoder", ["decord", "pyav"])
@pytest.mark.parametrize("width, height, resolution", [(128, 96, 48), (96, 128, 64), (128, 128, 40)])
def test_frames_scaled_by_the_decoder_match_the_pil_reference(tmp_path, decoder, width, height, resolution):
    path = _smooth_video(tmp_path / "smooth.mp4", width, height)
    info = VideoInfo(path, 12, 30.0, height, width)
    frames = [0, 5, 11]
    full = open_reader(path, decoder).get(frames)
    reference = square_resize(full, resolution).astype(int)
    reader = open_scaled_reader(info, resolution, decoder)
    assert (reader.width, reader.height) == scaled_size(width, height, resolution)
    scaled = crop_square(reader.get(frames), resolution).astype(int)
    assert scaled.shape == reference.shape == (3, 3, resolution, resolution)
    diff = np.abs(scaled - reference)
    assert diff.mean() < 3.0 and np.percentile(diff, 99) <= 24, (diff.mean(), np.percentile(diff, 99))
    # a crop misplaced by a few pixels is far off: the comparison can tell
    shifted = crop_square(np.roll(reader.get(frames), 4, axis=2), resolution).astype(int)
    assert np.abs(shifted - reference).mean() > 2 * diff.mean()


@pytest.mark.parametrize("width, height, resolution", [(128, 96, 48), (96, 128, 64)])
def test_frames_scaled_on_the_decoding_device_match_the_pil_reference(tmp_path, width, height, resolution):
    """data.decode_device=cuda scales what NVDEC decoded on the device (torchcodec 0.11 applies its Resize on the
    CPU only): the same scaling, run here on CPU tensors, is as close to the reference as the decoders' own."""
    pytest.importorskip("torchcodec")
    from raystream.data.decode.torchcodec_reader import TorchCodecReader, scale_frames

    path = _smooth_video(tmp_path / "smooth.mp4", width, height)
    frames = [0, 5, 11]
    full = TorchCodecReader(path).get(frames)
    reference = square_resize(full, resolution).astype(int)
    w, h = scaled_size(width, height, resolution)
    scaled = scale_frames(torch.from_numpy(full), (h, w))
    assert scaled.dtype == torch.uint8 and scaled.shape == (3, h, w, 3)
    diff = np.abs(crop_square(scaled.numpy(), resolution).astype(int) - reference)
    assert diff.mean() < 3.0 and np.percentile(diff, 99) <= 24, (diff.mean(), np.percentile(diff, 99))
    by_torchcodec = TorchCodecReader(path, size=(w, h)).get(frames).astype(int)
    assert np.abs(scaled.numpy().astype(int) - by_torchcodec).mean() < 3.0


def test_sizes_decord_cannot_scale_to_are_resized_after_decoding(block_videos):
    info = VideoInfo(block_videos[0], 40, 30.0, 32, 32)
    reader = open_scaled_reader(info, 16, "decord")  # decord 0.6 fails on 16 px wide output
    out = reader.get([0, 1, 7])
    assert out.shape == (3, 16, 16, 3)
    np.testing.assert_allclose(crop_square(out, 16).astype(float),
                               square_resize(open_reader(block_videos[0]).get([0, 1, 7]), 16), atol=1)


def test_scaled_size_keeps_the_aspect_with_the_short_side_at_the_resolution():
    assert scaled_size(320, 240, 224) == (298, 224)  # the 40 px crop offset scaled: 37.3 -> 37 each side
    assert scaled_size(240, 320, 224) == (224, 298)
    assert scaled_size(256, 256, 224) == (224, 224)


def _plan(order, counts, B, keys, frames_of, horizon, start=0):
    o = Order(order, counts, B, seed=3, epochs=2)

    def needs(step):
        vids, clips = o.clips_at(step)
        out = {}
        for v, k in zip(vids.tolist(), clips.tolist()):
            out.setdefault(v, []).extend(frames_of(k))
        return out

    segs = {v: Segments(keys, 40, 6) for v in range(len(counts))}
    return o, Plan(needs, o.num_steps, start, segs.__getitem__, o.sequential, horizon)


def _jobs(plan):
    out = []
    while (job := plan.next_closed()) is not None:
        out.append(job)
    return out


@pytest.mark.parametrize("order", ["batch_along_time", "batch_along_video"])
def test_sequential_plans_decode_every_frame_once_per_pass(order):
    frames_of = lambda k: [k, k + 3, k + 6]  # noqa: E731 - overlapping clips
    o, plan = _plan(order, [30, 25, 30, 20], 2, [0, 10, 20, 30], frames_of, horizon=1)
    jobs = _jobs(plan)
    for t in range(o.num_steps):
        for (v, f), job in plan.uses(t).items():
            assert f in job.frames and job.video == v and job.first <= t <= job.last
    decoded = [(j.video, f, j.first < o.steps_per_pass) for j in jobs for f in j.frames]
    assert len(decoded) == len(set(decoded))  # no frame twice within a pass
    for j in jobs:  # a job stays within one segment: at most 6 frames, never across a keyframe
        assert j.frames[-1] - j.frames[0] < 6 and (j.frames[0] < 10) == (j.frames[-1] < 10)


def test_shuffled_plans_decode_each_segment_once_per_horizon():
    frames_of = lambda k: [k, k + 2]  # noqa: E731
    jobs_per_horizon = {}
    for horizon in (1, 4):
        o, plan = _plan("shuffled", [35, 35], 4, [0, 12, 24], frames_of, horizon)
        jobs = _jobs(plan)
        for j in jobs:
            assert j.last - j.first < horizon
            # no other job of the same segment is open at the same time
            assert not [k for k in jobs if k is not j and (k.video, k.segment) == (j.video, j.segment)
                        and k.first <= j.last and j.first <= k.last]
        jobs_per_horizon[horizon] = len(jobs)
    assert jobs_per_horizon[4] < 0.6 * jobs_per_horizon[1]  # clips of a segment share one pass over it


def test_decode_keys_are_checked():
    predicates = {check.key: check.predicate for check in DATA_CHECKS}
    assert predicates["decode_workers"](None) and predicates["decode_workers"](3)
    assert not predicates["decode_workers"](0)
    assert not predicates["shuffle_horizon"](0) and predicates["shuffle_horizon"](4)
    assert DataConfig().decode_workers is None


def test_a_decode_slower_than_the_timeout_ends_the_inline_stream(block_videos):
    stream = build_stream(data_cfg(block_videos, prefetch=0, decode_timeout_s=1e-6), stream_cfg())
    with pytest.raises(DataError, match=r"v1\.mp4: decoding frames .* took longer than data.decode_timeout_s"):
        next(iter(stream))
    stream.close()


@pytest.mark.parametrize("dtype", ["float", "uint8"])
def test_device_stream_on_cpu_is_the_stream_and_restores_at_the_batch_it_yielded(block_videos, dtype):
    s = stream_cfg(dtype=dtype, epochs=2, **SETTINGS["future"])
    plain = _all(build_stream(data_cfg(block_videos), s))
    device = DeviceStream(build_stream(data_cfg(block_videos), s), "cpu", prefetch=2)
    got = []
    for batch in device:
        assert batch.frames.dtype == (torch.float32 if dtype == "float" else torch.uint8)
        assert batch.model_inputs(torch.device("cpu"))["frames"] is batch.frames
        got.append((batch.step, batch.clips, batch.frames, batch.target))
        if len(got) == 3:
            break
    state = device.state_dict()
    assert state["step"] == 3  # not the batches copied ahead
    device.close()
    again = DeviceStream(build_stream(data_cfg(block_videos), s), "cpu")
    again.load_state_dict(state)
    got += [(b.step, b.clips, b.frames, b.target) for b in again]
    _same(plain, got)
    assert again.state_dict()["step"] == again.num_steps


def test_both_decoders_find_the_keyframes_segments_start_at(block_videos):
    for path, gop, n in zip(block_videos, (10, 7, 12, 5), (40, 25, 33, 21)):
        keys = [open_reader(path, decoder).keyframes for decoder in ("decord", "pyav")]
        assert keys[0] == keys[1] == list(range(0, n, gop))
        segments = Segments(keys[0], n, max_frames=4)
        assert segments.starts[:3] == [0, 4, min(8, gop)] and segments.of(n - 1) == len(segments.starts) - 1


def test_decode_device_cuda_falls_back_to_the_cpu_saying_why_in_one_line(block_videos):
    """data.decode_device=cuda where frames cannot be decoded on the GPU (no CUDA device, a CPU torchcodec build,
    another decoder): one warning of one line saying why, and the same batches as on the CPU. On a GPU node
    `raystream bench --decoders` measures the NVDEC path instead."""
    from raystream.data.decode.torchcodec_reader import cuda_unavailable

    if cuda_unavailable() is None:
        pytest.skip("this machine decodes on the GPU (raystream bench --decoders measures it)")
    s = stream_cfg(order="shuffled")
    cpu = _all(build_stream(data_cfg(block_videos), s))
    for decoder in ("auto", "pyav"):
        with pytest.warns(UserWarning, match="data.decode_device=cuda") as said:
            stream = build_stream(data_cfg(block_videos, decoder=decoder, decode_device="cuda"), s)
        (line,) = [str(w.message) for w in said if "decode_device" in str(w.message)]
        assert "\n" not in line and (cuda_unavailable() in line if decoder == "auto" else "torchcodec only" in line)
        assert stream.decode_device == "cpu"
        _same(_all(stream), cpu)
    from raystream.config import ConfigError, compose

    with pytest.raises(ConfigError, match="decode_device"):
        compose(["data.decode_device=gpu"])


def test_auto_tries_the_fastest_exact_decoder_first_on_the_cpu_and_torchcodec_first_for_the_gpu():
    """data.decoder=auto's order: decord (the fastest here, docs/benchmarks.md), torchcodec, PyAV on the CPU; with
    data.decode_device=cuda torchcodec first (NVDEC). Only installed decoders are tried; PyAV is always there."""
    from raystream.data.decode.backends import installed_decoders
    from raystream.data.videos.probing import _candidates

    cpu, gpu = installed_decoders("cpu"), installed_decoders("cuda")
    assert cpu[-1] == gpu[-1] == "pyav" and set(cpu) == set(gpu)
    assert [d for d in ("decord", "torchcodec") if d in cpu] == list(cpu[:-1])
    assert [d for d in ("torchcodec", "decord") if d in gpu] == list(gpu[:-1])
    # the probe's child is handed auto's whole order and loads each decoder when a file first needs it
    assert _candidates("auto", "cpu") == ["decord", "torchcodec"]
    assert _candidates("auto", "cuda") == ["torchcodec", "decord"]
    assert _candidates("decord", "cuda") == ["decord"] and _candidates("pyav") == []


def test_auto_loads_a_later_decoder_only_for_a_file_that_needs_it(block_videos):
    """Importing torchcodec (and the FFmpeg libraries it tries) takes seconds in a fresh process, every probe child
    and every Ray worker: under auto, a video decord reads exactly is probed and read without loading it."""
    import subprocess
    import sys

    from raystream.data.decode.backends import unavailable

    if unavailable("decord") is not None:
        pytest.skip("decord is not installed here")
    code = ("import json, sys; from raystream.data.videos.probing import _probe_one; "
            "from raystream.data.decode.backends import open_reader; "
            "facts = _probe_one(sys.argv[1], 'auto'); open_reader(sys.argv[1], 'auto').close(); "
            "print(json.dumps([facts.get('decoded_by'), facts.get('error'), 'torchcodec' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, block_videos[0]], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["decord", None, False]
