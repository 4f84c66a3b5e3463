"""Labelled probe sets of videos (raystream/eval/labelled_videos.py): the demo's (rendered, deterministic, carrying
class signal) and a folder of class sub-folders of the user's videos (70/30 split by video)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from raystream.config import compose
from raystream.data.config import DataConfig, StreamConfig
from raystream.data.demo.encode import write_video
from raystream.eval import knn_top1
from raystream.eval.labelled_videos import load_probe_set

TINY = ["data.demo.num_videos=2", "data.demo.frames_per_video=40", "data.demo.canvas=32", "data.demo.scene_frames=10",
        "data.demo.heldout_videos=1", "stream.batch_size=4"]


@pytest.mark.parametrize("kind, classes", [("moving_digits", 10), ("walking_tour", 7)])
def test_demo_probe_sets_are_labelled_clips(tmp_path, kind, classes):
    cfg = compose(TINY + [f"data.demo.cache_dir={tmp_path}", f"data.demo.kind={kind}", "data.demo.probe_per_class=4",
                          "stream.resolution=16"])
    probe = load_probe_set(cfg.data, cfg.stream, cfg.eval)
    assert probe.num_classes == classes
    assert probe.train_x.shape == (2 * classes, 4, 3, 16, 16) and probe.test_x.shape == probe.train_x.shape
    assert sorted(probe.train_y.tolist()) == sorted(probe.test_y.tolist()) == sorted(list(range(classes)) * 2)
    assert 0 <= float(probe.train_x.min()) and float(probe.train_x.max()) <= 1 and float(probe.train_x.max()) > 0.5
    assert not torch.equal(probe.train_x, probe.test_x)
    again = load_probe_set(cfg.data, cfg.stream, cfg.eval)
    assert torch.equal(again.train_x, probe.train_x)


def test_probe_set_from_a_folder_of_class_videos(tmp_path):
    for c, name in enumerate(("first", "second")):
        for v in range(2):  # a class's videos: its own grey level, a frame-dependent stripe
            frames = np.full((30, 32, 32, 3), 60 + 120 * c, np.uint8)
            for i in range(30):
                frames[i, :, i % 32] = 255
            write_video(tmp_path / name / f"v{v}.mp4", frames, 30, crf=0)
    probe = load_probe_set(DataConfig(videos=None, decode_timeout_s=60.0),
                           StreamConfig(batch_size=4, frames_per_clip=2, clip_shift=1, resolution=32),
                           SimpleNamespace(dataset=str(tmp_path), max_probe_samples=16))
    assert probe.num_classes == 2 and probe.class_names == ("first", "second")
    assert probe.train_x.shape[1:] == (2, 3, 32, 32) and len(probe.train_y) + len(probe.test_y) > 4
    assert set(probe.train_y.tolist()) == {0, 1} and set(probe.test_y.tolist()) == {0, 1}


def test_moving_digits_probe_is_learnable_from_pixels(tmp_path):
    """The default probe must carry class signal: raw pixels alone beat chance (0.10) by a wide margin, so the
    probe can tell features apart. (A stream-sized sprite at a random place scored chance, even for pixels.)"""
    cfg = compose([f"data.demo.cache_dir={tmp_path}"])
    p = load_probe_set(cfg.data, cfg.stream, cfg.eval)
    assert p.num_classes == 10 and p.train_y.bincount().min() >= 10
    flat = lambda x: x.mean(1).flatten(1)  # noqa: E731
    assert knn_top1(flat(p.train_x), p.train_y, flat(p.test_x), p.test_y, p.num_classes) > 0.3


def test_own_videos_without_a_probe_set_is_an_error_naming_eval_dataset(tmp_path):
    """With videos of one's own (data.videos set: not the demo) there is no demo probe set to fall back on."""
    from raystream.data import DataError

    cfg = compose(TINY + [f"data.videos={tmp_path}", "eval.dataset=null"])
    with pytest.raises(DataError, match=r"`eval.dataset` is not set: probing a model trained on your own videos"):
        load_probe_set(cfg.data, cfg.stream, cfg.eval)
