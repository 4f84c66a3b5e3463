"""Demo videos (deterministic, cached, real mp4), held-out streams, `raystream data inspect` and `make-demo`, and
the stream presets of the paper's settings. (The demo probe sets: tests/eval/test_eval_labelled_videos.py.)"""

from __future__ import annotations

import json
import os

import pytest
import torch
from rs_data_helpers import data_cfg, stream_cfg

from raystream.config import ConfigError, compose
from raystream.data import build_heldout_stream, build_stream, ensure_demo_videos
from raystream.data.config import DemoConfig
from raystream.data.decode.backends import open_reader
from raystream.data.decode.exact import misread
from raystream.data.stream.clips import ClipGeometry

TINY = ["data.demo.num_videos=2", "data.demo.frames_per_video=40", "data.demo.canvas=32", "data.demo.scene_frames=10",
        "data.demo.heldout_videos=1", "stream.batch_size=4"]


def tiny_demo(tmp_path, **kw) -> DemoConfig:
    base = dict(num_videos=2, frames_per_video=30, canvas=32, scene_frames=10, heldout_videos=1,
                cache_dir=str(tmp_path))
    base.update(kw)
    return DemoConfig(**base)


@pytest.mark.parametrize("kind", ["moving_digits", "walking_tour", "photo_pans"])
def test_demo_videos_are_deterministic_cached_small_and_moving(tmp_path, kind):
    cfg = tiny_demo(tmp_path / "a", kind=kind)
    paths = ensure_demo_videos(cfg)
    assert len(paths) == 2 and all(p.suffix == ".mp4" and p.exists() for p in paths)
    mtimes = [p.stat().st_mtime_ns for p in paths]
    assert ensure_demo_videos(cfg) == paths and [p.stat().st_mtime_ns for p in paths] == mtimes  # cached
    other = ensure_demo_videos(tiny_demo(tmp_path / "b", kind=kind))
    for p, q in zip(paths, other):
        a, b = open_reader(str(p)).get(range(30)), open_reader(str(q)).get(range(30))
        assert a.shape == (30, 32, 32, 3) and (a == b).all()  # the same config gives the same frames
        assert (a[0] != a[-1]).any()  # things move
        assert p.stat().st_size < 500_000
        assert misread(open_reader(str(p)), open_reader(str(p), "pyav")) is None  # decord reads it: no PyAV fallback
    changed = ensure_demo_videos(tiny_demo(tmp_path / "a", kind=kind, drift_speed=2.0))
    assert changed[0].parent != paths[0].parent  # a knob that changes the video changes the cache key
    held = ensure_demo_videos(cfg, heldout=True)
    assert len(held) == 1 and "heldout" in held[0].parent.name


def test_photo_pans_frames_are_crops_of_the_left_halves_only():
    """The start's source never shows a pixel of the right halves, where the held-out photo probe's val crops are."""
    from raystream.data.demo.render import photo_halves, render_video

    cfg = DemoConfig(kind="photo_pans", frames_per_video=30, canvas=32, scene_frames=10, objects_per_frame=0,
                     drift_speed=2.0)
    frames = list(render_video(cfg, 0))

    def found_in(frame, image):
        h, w = image.shape[:2]
        return any((image[y:y + 32, x:x + 32] == frame).all() for y in range(h - 31) for x in range(w - 31))

    halves = photo_halves(64)
    for t, frame in enumerate(frames):
        assert any(found_in(frame, left) for left, _ in halves), f"frame {t} is not a crop of a left half"
    assert (frames[0] != frames[1]).any()  # the camera drifts
    assert not any(found_in(frames[0], right) for _, right in halves if right.shape[1] > 32)


def test_default_demo_stream_and_heldout_stream(tmp_path):
    cfg = compose(TINY + [f"data.demo.cache_dir={tmp_path}"])
    stream = build_stream(cfg.data, cfg.stream)
    batch = next(iter(stream))
    assert batch.frames.shape == (4, 4, 3, 32, 32) and batch.frames.dtype == torch.float32
    held = build_heldout_stream(cfg.data, cfg.stream)
    assert all("heldout" in v.path for v in held.videos) and held.epochs == 1
    assert not {v.path for v in held.videos} & {v.path for v in stream.videos}
    assert next(iter(held)).frames.shape == (4, 4, 3, 32, 32)


def test_heldout_stream_of_own_videos_needs_the_key(block_videos):
    from raystream.data import DataError

    with pytest.raises(DataError, match="data.heldout_videos"):
        build_heldout_stream(data_cfg(block_videos), stream_cfg())
    held = build_heldout_stream(data_cfg(block_videos, heldout_videos=block_videos[:2]), stream_cfg(epochs=3))
    assert held.epochs == 1 and len(held.videos) == 2


def _inspect(cfg, capsys, **kw):
    from raystream.data.stream.inspect import main

    assert main(cfg, **kw) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_inspect_prints_the_global_batches_and_rank_shards(block_videos, capsys):
    cfg = compose(["stream.batch_size=4", "stream.frames_per_clip=3", "stream.clip_shift=1",
                   f"data.videos=[{','.join(block_videos)}]"])
    whole = _inspect(cfg, capsys, batches=3, start_step=0, world_size=None)
    assert [o["step"] for o in whole] == [0, 1, 2]
    assert whole[0]["clips"][0] == {"video": block_videos[0], "frames": [0, 2, 4]}
    assert [c["frames"][0] for c in whole[1]["clips"]] == [4, 5, 6, 7]
    shards = _inspect(cfg, capsys, batches=2, start_step=1, world_size=2)
    assert [(o["step"], o["rank"]) for o in shards] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert shards[0]["clips"] + shards[1]["clips"] == whole[1]["clips"]
    from raystream.data.stream.inspect import main

    assert main(cfg, batches=1, start_step=0, world_size=3) == 2
    assert "not divisible" in capsys.readouterr().err


def test_inspect_future_prediction_prints_targets(block_videos, capsys):
    cfg = compose(["stream=future_prediction", "stream.batch_size=2", f"data.videos=[{block_videos[0]}]"])
    obj = _inspect(cfg, capsys, batches=1, start_step=0, world_size=None)[0]
    assert obj == {"step": 0, "clips": [{"video": block_videos[0], "frames": [0, 1, 2, 3], "target": [22, 23, 24, 25]},
                                        {"video": block_videos[0], "frames": [4, 5, 6, 7], "target": [26, 27, 28, 29]}]}


def test_make_demo_writes_and_prints_the_videos(tmp_path, capsys):
    from raystream.data.demo.videos import main

    cfg = compose(TINY + [f"data.demo.cache_dir={tmp_path}"])
    assert main(cfg) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 3 and all(p.endswith(".mp4") and os.path.exists(p) for p in printed)


@pytest.mark.parametrize("preset, source_fps, stride, F, targets", [
    ("dora", 60, 60, 8, 0), ("videomae", 30, 3, 16, 0), ("future_prediction", 30, 1, 4, 4)])
def test_stream_presets_express_the_paper_settings(preset, source_fps, stride, F, targets):
    cfg = compose([f"stream={preset}"])
    g = ClipGeometry.from_config(cfg.stream, source_fps)
    assert (g.stride, g.frames_per_clip, g.target_frames) == (stride, F, targets)
    if preset == "dora":
        assert g.shift == 1 and g.span == 420
    if preset == "future_prediction":
        assert g.targets(0)[0] - g.frames(0)[-1] == round(0.64 * 30)


@pytest.mark.parametrize("override", ["data.demo.kind=cartoon", "data.decode_timeout_s=0", "data.demo.canvas=33",
                                      "stream.target_offset_s=-1"])
def test_bad_data_and_stream_keys_fail_composition(override):
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        compose([override])
