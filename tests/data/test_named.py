"""Which videos a config names (raystream/data/named.py) and where the node cache is (data/cache_root.py): each rule
written once, read by the stream, the driver's checks and record, and `raystream data make-footage`."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from raystream.data.cache_root import CACHE_ENV, cache_root
from raystream.data.config import DataConfig, DemoConfig
from raystream.data.named import given_paths, given_videos, heldout_videos, training_videos, uses_demo
from raystream.data.videos.cache import default_cache_dir


def _data(tmp_path, **given):
    cfg = OmegaConf.structured(DataConfig)
    cfg.demo = OmegaConf.merge(cfg.demo, {"num_videos": 1, "heldout_videos": 1, "frames_per_video": 8,
                                          "cache_dir": str(tmp_path / "demo")})
    return OmegaConf.merge(cfg, given)


def test_without_videos_of_its_own_a_config_names_the_demo_videos_made_once(tmp_path):
    data = _data(tmp_path)
    training, heldout = training_videos(data), heldout_videos(data)
    assert uses_demo(data) and training.demo and heldout.demo
    assert (training.key, heldout.key) == ("data.videos", "data.heldout_videos")
    assert training.name == "demo-moving_digits" and heldout.name == "demo-moving_digits-heldout"
    assert all(Path(p).is_file() and Path(p).parent == Path(training.source) for p in training.spec)
    assert all(Path(p).is_file() and Path(p).parent == Path(heldout.source) for p in heldout.spec)
    assert set(training.spec).isdisjoint(heldout.spec)
    assert given_videos(data) == [] and given_paths(data) == []
    assert heldout_videos(data, demo=False) is None  # a scenario that does not evaluate on them: none made


def test_own_videos_are_named_as_given_and_have_no_demo_heldout_set(tmp_path):
    data = _data(tmp_path, videos=["/v/walks/a.mp4", "/v/walks/b.mp4"])
    training = training_videos(data)
    assert not uses_demo(data) and not training.demo
    assert training.spec == ["/v/walks/a.mp4", "/v/walks/b.mp4"]
    assert (training.name, training.source) == ("walks (2 videos)", "/v/walks")
    assert heldout_videos(data) is None
    assert not (tmp_path / "demo").exists()  # nothing rendered for a config with videos of its own
    data = _data(tmp_path, videos="s3://bucket/walks/", heldout_videos="/v/held.txt")
    assert (training_videos(data).name, training_videos(data).source) == ("walks", "s3://bucket/walks/")
    assert heldout_videos(data).spec == "/v/held.txt" and heldout_videos(data).name == "held.txt"
    assert given_paths(data) == ["s3://bucket/walks/", "/v/held.txt"]


def test_the_cache_root_is_the_environment_s_else_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_root() == tmp_path and default_cache_dir() == str(tmp_path / "videos")
    assert OmegaConf.to_container(OmegaConf.structured(DemoConfig), resolve=True)["cache_dir"] == f"{tmp_path}/demo"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_root() == Path.home() / ".cache" / "raystream"
    assert default_cache_dir() == str(Path.home() / ".cache" / "raystream" / "videos")


@pytest.mark.parametrize("spec", [[], ["a.mp4"]])
def test_a_list_without_a_folder_is_named_by_its_count(tmp_path, spec):
    named = training_videos(_data(tmp_path, videos=spec))
    assert named.source == "." and named.name.endswith(f"({len(spec)} videos)")


def test_the_cache_root_is_written_once_and_config_files_ask_it(monkeypatch):
    """data/cache_root.py holds the rule ($RAYSTREAM_CACHE_DIR, else ~/.cache/raystream); the shipped config files
    say `${raystream_cache_root:}` instead of spelling it, and resolve to what the rule says."""
    from pathlib import Path

    from raystream.config import compose

    sweeps = Path(__file__).parents[2] / "sweeps"
    spelled = [str(p) for p in sweeps.rglob("*.yaml") if "RAYSTREAM_CACHE_DIR" in p.read_text()
               or ".cache/raystream" in p.read_text()]
    assert spelled == []
    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", "/somewhere/cache")
    cfg = compose(["+experiment=table1_mini", "data=registry_footage"])
    assert cfg.scenario.backbone.init == "/somewhere/cache/starts/table1_start"
    assert str(cfg.data.videos[0]).startswith("/somewhere/cache/footage/")
    monkeypatch.delenv("RAYSTREAM_CACHE_DIR")
    assert compose([]).data.demo.cache_dir == "~/.cache/raystream/demo"  # as written: its user expands it
