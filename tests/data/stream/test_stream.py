"""Decoded streams: every frame of every clip is the frame the order says (read back from the frame's own block
code), for each order, with overlap, across video boundaries, sharded W=1/2/4, after restore, on both decoders."""

from __future__ import annotations

import json

import pytest
import torch
from rs_data_helpers import data_cfg, naive_time, naive_video, read_block, stream_cfg

from raystream.data import Batch, DataError, build_stream
from raystream.data.stream.orders import ORDERS

SETTINGS = {
    "overlap": dict(frames_per_clip=3, fps=15.0, clip_shift=1),  # stride 2: neighbours share 2 of 3 frames
    "disjoint": dict(frames_per_clip=2, fps=30.0, clip_shift=3),
    "future": dict(frames_per_clip=2, fps=15.0, clip_shift=2, target_frames=2, target_offset_s=0.1),
}


def video_id(path: str) -> int:
    return int(path.rsplit("v", 1)[1].split(".")[0])


def check_batch(batch: Batch, s, rank: int, b: int) -> list:
    """Assert every frame decodes to its ClipRef's frame; return the batch's (video, clip) pairs."""
    assert batch.frames.shape == (b, s.frames_per_clip, 3, 32, 32)
    assert batch.index.tolist() == list(range(rank * b, (rank + 1) * b))
    stride = round(30 / s.fps)
    pairs = []
    for i, ref in enumerate(batch.clips):
        k = ref.frames[0] // s.clip_shift
        assert ref.frames == [k * s.clip_shift + j * stride for j in range(s.frames_per_clip)]
        for j, f in enumerate(ref.frames):
            assert read_block(batch.frames[i, j]) == (video_id(ref.video), f)
        if s.target_frames:
            gap = round(s.target_offset_s * 30)
            assert ref.target == [ref.frames[-1] + gap + j * stride for j in range(s.target_frames)]
            for j, f in enumerate(ref.target):
                assert read_block(batch.target[i, j]) == (video_id(ref.video), f)
        else:
            assert batch.target is None
        pairs.append((int(batch.video_index[i]), k))
    return pairs


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("order", ORDERS)
def test_every_decoded_frame_is_the_frame_the_order_says(block_videos, order, setting):
    s = stream_cfg(order=order, batch_size=4, epochs=2 if order == "shuffled" else 1, **SETTINGS[setting])
    sequences = {}
    for W in (1, 2, 4):
        per_step = {}
        for rank in range(W):
            stream = build_stream(data_cfg(block_videos), s, rank=rank, world_size=W)
            for batch in stream.batches():
                per_step.setdefault(batch.step, []).extend(check_batch(batch, s, rank, 4 // W))
            stream.close()
        assert sorted(per_step) == list(range(stream.num_steps))
        sequences[W] = [per_step[t] for t in range(stream.num_steps)]
    assert sequences[1] == sequences[2] == sequences[4]  # the same global sequence for any number of workers
    counts = [g.num_clips(v.num_frames) for g, v in zip(stream.geometry, stream.videos)]
    seq = sequences[1]
    if order == "batch_along_time":
        assert seq == naive_time(counts, 4, 1)
        assert any(len({v for v, _ in batch}) > 1 for batch in seq)  # batches cross video boundaries
    elif order == "batch_along_video":
        assert seq == naive_video(counts, 4, 1)
    else:
        half = len(seq) // 2
        for p in (seq[:half], seq[half:]):  # each pass: distinct clips, drawn anew
            clips = [c for b in p for c in b]
            assert len(set(clips)) == len(clips) == (sum(counts) // 4) * 4
        assert seq[:half] != seq[half:]


def test_batch_along_video_needs_as_many_videos_as_slots(block_videos):
    with pytest.raises(DataError, match="at least batch_size videos"):
        build_stream(data_cfg(block_videos), stream_cfg(order="batch_along_video", batch_size=8))


@pytest.mark.parametrize("order", ORDERS)
def test_restore_mid_pass_continues_with_exactly_the_next_batch(block_videos, order):
    s = stream_cfg(order=order, batch_size=2, epochs=2, **SETTINGS["overlap"])
    d = data_cfg(block_videos)
    full = [(b.step, b.clips, b.frames) for b in build_stream(d, s, rank=1, world_size=2).batches()]
    stream = build_stream(d, s, rank=1, world_size=2)
    cut = stream.num_steps // 2 + 3  # inside the second pass (the shuffled order is re-drawn there)
    it = iter(stream)
    for _ in range(cut):
        next(it)
    state = json.loads(json.dumps(stream.state_dict()))
    assert state["step"] == cut
    stream.close()
    restored = build_stream(data_cfg(block_videos, prefetch=0), s, rank=1, world_size=2)
    restored.load_state_dict(state)
    rest = list(restored)
    assert [b.step for b in rest] == list(range(cut, stream.num_steps))
    for (step, clips, frames), b in zip(full[cut:], rest):
        assert (step, clips) == (b.step, b.clips) and torch.equal(frames, b.frames)
    assert restored.state_dict()["step"] == stream.num_steps
    # batches(start_step=S) is the same as a restore at S
    again = list(build_stream(d, s, rank=1, world_size=2).batches(start_step=cut))
    assert [b.clips for b in again] == [c for _, c, _ in full[cut:]]


def test_state_of_another_stream_is_refused(block_videos):
    a = build_stream(data_cfg(block_videos), stream_cfg())
    b = build_stream(data_cfg(block_videos), stream_cfg(seed=1, order="shuffled"))
    with pytest.raises(DataError, match="different stream"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(DataError, match="start_step"):
        a.batches(start_step=a.num_steps + 1)


@pytest.mark.parametrize("order, B", [("batch_along_time", 4), ("batch_along_video", 2)])
def test_overlapping_clips_decode_every_frame_once(block_videos, order, B):
    s = stream_cfg(order=order, batch_size=B, frames_per_clip=4, fps=10.0, clip_shift=1)  # 4 of 4 frames shared
    stream = build_stream(data_cfg(block_videos), s)
    used = set()
    for batch in stream.batches():
        used.update((ref.video, f) for ref in batch.clips for f in ref.frames)
    assert stream.frames_decoded == len(used)


@pytest.mark.parametrize("workers", [1, 2])
def test_frames_held_are_bounded_by_the_clip_span_not_the_video_length(tmp_path, workers):
    from rs_data_helpers import write_block_video

    path = str(write_block_video(tmp_path / "v5.mp4", 5, 400, gop=10))
    s = stream_cfg(batch_size=4, frames_per_clip=4, fps=10.0, clip_shift=1)  # span 9 frames
    stream = build_stream(data_cfg([path], decode_workers=workers), s)
    batches = list(stream.batches())
    assert len(batches) == stream.num_steps > 90
    assert stream.frames_decoded == len({f for b in batches for ref in b.clips for f in ref.frames})  # each once
    # the steps in use (span + a batch of clip starts) plus a segment (a GOP) per worker ahead and one being started
    assert stream.frames_held <= stream.geometry[0].span + 4 + (workers + 2) * 10 < 60


def test_decord_and_pyav_give_identical_frames(block_videos):
    for order in ("batch_along_time", "shuffled"):
        s = stream_cfg(order=order, **SETTINGS["overlap"])
        a = list(build_stream(data_cfg(block_videos, decoder="decord"), s).batches())
        b = list(build_stream(data_cfg(block_videos, decoder="pyav"), s).batches())
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            assert x.clips == y.clips and torch.equal(x.frames, y.frames)


def test_pyav_reader_seeks_and_reads_through(block_videos):
    from raystream.data.decode.backends import open_reader

    for path in block_videos:
        for max_read_through in (0, 250):
            reader = open_reader(path, "pyav", max_read_through=max_read_through)
            n = reader.num_frames
            indices = [n - 5, n - 4, n - 1, 3, 4, n - 8, 0, n - 1, 1]
            for i in indices:
                frame = torch.from_numpy(reader.get([i])[0]).permute(2, 0, 1)
                side = min(frame.shape[1:])
                left = (frame.shape[2] - side) // 2
                assert read_block(frame[:, :, left:left + side]) == (video_id(path), i)
            reader.close()


def test_float_frames_in_unit_range_and_resized(block_videos):
    s = stream_cfg(dtype="float", resolution=16, **SETTINGS["disjoint"])
    batch = next(iter(build_stream(data_cfg(block_videos), s)))
    assert batch.frames.dtype == torch.float32 and batch.frames.shape[-2:] == (16, 16)
    assert 0.0 <= float(batch.frames.min()) and float(batch.frames.max()) <= 1.0
    for i, ref in enumerate(batch.clips):
        assert [read_block(batch.frames[i, j])[1] for j in range(2)] == ref.frames


def test_uneven_shards_are_a_data_error(block_videos):
    with pytest.raises(DataError, match="not divisible"):
        build_stream(data_cfg(block_videos), stream_cfg(batch_size=4), rank=0, world_size=3)


def test_stream_pickles_without_its_readers(block_videos):
    import pickle

    stream = build_stream(data_cfg(block_videos), stream_cfg())
    first = next(iter(stream))
    clone = pickle.loads(pickle.dumps(stream))
    assert clone.state_dict() == stream.state_dict()
    assert next(iter(clone)).step == first.step + 1


def test_a_batch_slower_than_the_timeout_is_a_data_error_not_a_hang(block_videos):
    build_stream(data_cfg(block_videos), stream_cfg())  # probes (and caches) the files with a normal timeout
    stream = build_stream(data_cfg(block_videos, decode_timeout_s=1e-6), stream_cfg())
    with pytest.raises(DataError, match="decode_timeout_s"):
        list(stream.batches())
    stream.close()


def test_an_old_iterator_closing_late_does_not_stop_a_newer_one(block_videos):
    stream = build_stream(data_cfg(block_videos), stream_cfg(**SETTINGS["disjoint"]))
    old = stream.batches(0)
    assert next(old).step == 0
    new = stream.batches(3)
    assert next(new).step == 3
    with pytest.raises(DataError, match="superseded"):
        list(old)
    old.close()
    assert [b.step for b in new] == list(range(4, stream.num_steps))


def test_decord_reader_flushes_at_keyframes_and_keeps_every_frame(tmp_path):
    """Forward reads that cross a keyframe flush decord's decoder there (what bounds its memory) and still return
    every frame exactly once, in order, whatever the chunking; a reset of 0 never flushes."""
    from rs_data_helpers import write_block_video

    from raystream.data.decode.backends import DecordReader

    path = str(write_block_video(tmp_path / "v9.mp4", 9, 60, gop=10))
    for reset_frames, chunk, resets in ((6, 4, 5), (6, 7, 3), (1, 10, 5), (25, 4, 1), (0, 4, 0)):
        reader = DecordReader(path, reset_frames=reset_frames)
        got = []
        for start in range(0, 60, chunk):
            for frame in reader.get(list(range(start, min(60, start + chunk)))):
                got.append(read_block(torch.from_numpy(frame).permute(2, 0, 1)))
        assert got == [(9, i) for i in range(60)], (reset_frames, chunk)
        assert reader._keys == [0, 10, 20, 30, 40, 50]
        assert reader.resets == resets, (reset_frames, chunk)
        # a backward jump after a flush still lands on the right frames
        assert [read_block(torch.from_numpy(f).permute(2, 0, 1)) for f in reader.get([3, 4, 31])] == [
            (9, 3), (9, 4), (9, 31)]
        reader.close()
