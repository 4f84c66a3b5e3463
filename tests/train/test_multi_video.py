"""The multi-video preset (`+experiment=multi_video` on `data=short_walks`) in smoke size: its stream puts a batch's
clips in distinct videos along video and in one video along time, and `raystream data correlation` measures it. The
full-size figures (along video 0.85 > along time 0.59 > shuffled about 0) are in the README, not pinned here: at
this size a pass has 6 steps and the centred cosines say nothing about the regime."""

from __future__ import annotations

import json
import math

import pytest

from raystream.cli import main as cli_main
from raystream.config import compose
from raystream.data.stream.build import build_heldout_stream, build_stream

VIDEOS, FRAMES = 8, 46  # 6 clips a video (each spans 26 source frames, 4 apart)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    demo = tmp_path_factory.mktemp("short-walks")
    return ["+experiment=multi_video", f"data.demo.num_videos={VIDEOS}", f"data.demo.frames_per_video={FRAMES}",
            f"data.demo.cache_dir={demo}"]


def test_the_preset_composes_many_short_videos_batched_along_video():
    cfg = compose(["+experiment=multi_video"])
    assert (cfg.data.name, cfg.data.demo.kind, cfg.data.demo.num_videos) == ("short_walks", "walking_tour", 32)
    assert cfg.stream.order == "batch_along_video" and cfg.scenario.name == "future_prediction"
    assert cfg.data.demo.num_videos >= 32 >= cfg.stream.batch_size  # the batch-size sweep's largest batch fits


def _batches(overrides, steps):
    stream = build_stream(compose(overrides).data, compose(overrides).stream, rank=0, world_size=1)
    try:
        return [[(v, r.frames) for v, _, r in stream.clip_refs(t, range(stream.batch_size))] for t in range(steps)]
    finally:
        stream.close()


def test_along_video_holds_one_clip_of_every_slot_and_advances_each(smoke):
    first, second = _batches(smoke, 2)
    assert [v for v, _ in first] == list(range(VIDEOS)) == [v for v, _ in second]
    assert all(b[0] - a[0] == 4 for (_, a), (_, b) in zip(first, second))


def test_along_time_holds_consecutive_clips_of_one_video(smoke):
    first, second = _batches([*smoke, "stream.order=batch_along_time"], 2)
    assert [v for v, _ in first] == [0] * 6 + [1] * 2  # 6 clips a video: the batch crosses into the next one
    assert [f[0] for _, f in first[:6]] == [0, 4, 8, 12, 16, 20] 
    assert second[0][0] == 1 and second[0][1][0] == first[-1][1][0] + 4  # the next batch goes on where it stopped


def test_correlation_measures_the_preset(smoke, capsys):
    assert cli_main(["data", "correlation", *smoke, "--steps", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["order"] == "batch_along_video" and result["data"] == "short_walks" and result["pairs"] == 2
    assert all(math.isfinite(result[k]) and -1 <= result[k] <= 1 for k in ("sequential", "shuffled"))


def test_every_order_and_seed_is_evaluated_on_the_same_heldout_clips(smoke):
    """The out-of-stream error of runs batched along time, along video and shuffled (any seed) reads the same
    held-out clips, a sample of every held-out video; along video it needs no held-out video for every slot (the
    preset's 2 held-out videos against 8 slots failed the run)."""
    seen = []
    for order, seed in [("batch_along_time", 0), ("batch_along_video", 1), ("shuffled", 2)]:
        cfg = compose([*smoke, f"stream.order={order}", f"trainer.seed={seed}", f"stream.seed={seed}"])
        stream = build_heldout_stream(cfg.data, cfg.stream)
        try:
            seen.append([(v, r.frames) for t in range(stream.num_steps) for v, _, r in stream.clip_refs(t, range(stream.batch_size))])
        finally:
            stream.close()
    assert seen[0] == seen[1] == seen[2]
    assert len(seen[0]) == 8 and {v for v, _ in seen[0]} == {0, 1}  # a sample of both held-out videos
