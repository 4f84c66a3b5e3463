"""The batching orders as index arithmetic, against naive reference implementations of the issue's wording."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rs_data_helpers import naive_time, naive_video

from raystream.data.stream.clips import ClipGeometry
from raystream.data.stream.orders import ORDERS, Order, shard_places


def global_batches(order: Order):
    return [list(zip(*(a.tolist() for a in order.clips_at(t)))) for t in range(order.num_steps)]


counts_st = st.lists(st.integers(1, 9), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(counts=counts_st, B=st.sampled_from([1, 2, 4]), epochs=st.integers(1, 2))
def test_batch_along_time_is_the_concatenated_stream_in_chunks(counts, B, epochs):
    assert global_batches(Order("batch_along_time", counts, B, epochs=epochs)) == naive_time(counts, B, epochs)


@settings(max_examples=60, deadline=None)
@given(counts=counts_st, B=st.sampled_from([1, 2, 3, 4]), epochs=st.integers(1, 2))
def test_batch_along_video_walks_each_slot_through_its_videos(counts, B, epochs):
    assert global_batches(Order("batch_along_video", counts, B, epochs=epochs)) == naive_video(counts, B, epochs)


@settings(max_examples=40, deadline=None)
@given(counts=counts_st, B=st.sampled_from([1, 2, 4]), seed=st.integers(0, 5))
def test_shuffled_is_a_seeded_permutation_redrawn_per_pass(counts, B, seed):
    order = Order("shuffled", counts, B, seed=seed, epochs=2)
    batches = global_batches(order)
    all_clips = {(v, k) for v, n in enumerate(counts) for k in range(n)}
    spp = order.steps_per_pass
    for p in range(2):
        seen = [c for b in batches[p * spp:(p + 1) * spp] for c in b]
        assert len(seen) == len(set(seen)) == (len(all_clips) // B) * B
        assert set(seen) <= all_clips
    assert batches == global_batches(Order("shuffled", counts, B, seed=seed, epochs=2))


def test_shuffled_passes_differ_and_seeds_differ():
    a = global_batches(Order("shuffled", [50, 50], 4, seed=0, epochs=2))
    assert a[:25] != a[25:]
    assert a != global_batches(Order("shuffled", [50, 50], 4, seed=1, epochs=2))


@pytest.mark.parametrize("name", ORDERS)
@pytest.mark.parametrize("W", [1, 2, 4])
def test_shards_tile_the_global_batch_for_any_world_size(name, W):
    order = Order(name, [7, 3, 9, 4, 6], 4, seed=3, epochs=2)
    for t in range(order.num_steps):
        v, k = order.clips_at(t)
        parts = [order.clips_at(t, shard_places(4, W, r)) for r in range(W)]
        assert np.concatenate([p[0] for p in parts]).tolist() == v.tolist()
        assert np.concatenate([p[1] for p in parts]).tolist() == k.tolist()


def test_shard_places_rejects_uneven_split_and_bad_rank():
    assert list(shard_places(8, 4, 3)) == [6, 7]
    with pytest.raises(ValueError, match="not divisible"):
        shard_places(6, 4, 0)
    with pytest.raises(ValueError, match="rank"):
        shard_places(8, 2, 2)


def test_batch_along_video_with_fewer_videos_than_slots_has_no_steps():
    assert Order("batch_along_video", [5, 5], 4).num_steps == 0
    with pytest.raises(IndexError):
        Order("batch_along_video", [5, 5], 4).clips_at(0)


def test_unknown_order_is_named():
    with pytest.raises(ValueError, match="sideways"):
        Order("sideways", [3], 1)


@pytest.mark.parametrize(
    "cfg, fps, stride, frames, targets, clips_in_100",
    [
        (dict(frames_per_clip=8, fps=1, clip_shift=1), 60, 60, [0, 60, 120, 180, 240, 300, 360, 420], [], 0),
        (dict(frames_per_clip=16, fps=12, clip_shift=8), 30, 3, list(range(0, 46, 3)), [], 7),
        (dict(frames_per_clip=4, fps=30, clip_shift=4, target_frames=4, target_offset_s=0.64), 30, 1,
         [0, 1, 2, 3], [22, 23, 24, 25], 19),
    ],
    ids=["dora", "videomae", "future_prediction"],
)
def test_clip_geometry_of_the_paper_settings(cfg, fps, stride, frames, targets, clips_in_100):
    from types import SimpleNamespace

    g = ClipGeometry.from_config(SimpleNamespace(**{"target_frames": 0, "target_offset_s": 0.0, **cfg}), fps)
    assert g.stride == stride and g.frames(0) == frames and g.targets(0) == targets
    assert g.num_clips(100) == clips_in_100
    # the formula: floor((L - 1 - (F-1)*stride) / shift) + 1 clips (no targets)
    if not targets:
        assert g.num_clips(1000) == (1000 - 1 - (g.frames_per_clip - 1) * stride) // g.shift + 1
        assert g.frames(5)[-1] == 5 * g.shift + (g.frames_per_clip - 1) * stride
