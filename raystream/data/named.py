"""Which videos a config names: the one place that rule is written.

    training = training_videos(cfg.data)       # data.videos, or the demo videos (rendered once, then cached)
    heldout = heldout_videos(cfg.data)         # data.heldout_videos, the demo's held-out videos, or None
    paths = given_paths(cfg.data)              # the paths data.videos and data.heldout_videos list, as given

`data.videos` None means the generated demo videos (`data.demo`); then the held-out videos are the demo's held-out
ones (same generator, another seed, held-out digits). With videos of one's own, `data.heldout_videos` names the
held-out ones, or there are none. Each set is a `NamedVideos`: the config key it is read under, what the stream
lists (`spec`: a list of paths, a directory, a manifest; URIs included), and the set's name and source (what a
run's MLflow dataset input shows). The stream (stream/build.py), the driver's checks and its record
(train/preflight.py, train/inputs.py) and `raystream data make-footage` (footage.py) all ask here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from omegaconf import OmegaConf

from raystream.data.demo.videos import demo_dir, ensure_demo_videos

TRAINING_KEY, HELDOUT_KEY = "data.videos", "data.heldout_videos"


@dataclass(frozen=True)
class NamedVideos:
    """A set of videos a config names: `key` (the config key, for messages), `spec` (what `resolve_videos` lists),
    `name` and `source` (the set's name, and the path or URI it is read from), `demo` (the generated videos)."""

    key: str
    spec: Any
    name: str
    source: str
    demo: bool = False


def training_videos(data_cfg) -> NamedVideos:
    """The stream's videos: `data.videos`, else the demo videos (written on first use)."""
    if data_cfg.videos is None:
        return _demo(data_cfg, heldout=False)
    return _given(TRAINING_KEY, data_cfg.videos)


def heldout_videos(data_cfg, demo: bool = True) -> Optional[NamedVideos]:
    """The held-out videos: `data.heldout_videos`, else the demo's held-out videos with the demo (written on first
    use; with `demo` false, None: a run whose scenario does not evaluate on them), else None (own videos without
    held-out ones)."""
    if data_cfg.heldout_videos is not None:
        return _given(HELDOUT_KEY, data_cfg.heldout_videos)
    if data_cfg.videos is None and demo:
        return _demo(data_cfg, heldout=True)
    return None


def uses_demo(data_cfg) -> bool:
    """The run streams the generated demo videos (no `data.videos` of its own)."""
    return data_cfg.videos is None


def given_videos(data_cfg) -> List[NamedVideos]:
    """The sets the config itself lists (`data.videos`, `data.heldout_videos`), nothing rendered."""
    return [_given(key, spec) for key, spec in ((TRAINING_KEY, data_cfg.videos), (HELDOUT_KEY, data_cfg.heldout_videos))
            if spec is not None]


def given_paths(data_cfg) -> List[str]:
    """The paths `data.videos` and `data.heldout_videos` list as the config gives them (a single path counts as a
    list of one; the demo's are not given, so not listed)."""
    out: List[str] = []
    for videos in given_videos(data_cfg):
        out += [str(s) for s in videos.spec] if isinstance(videos.spec, (list, tuple)) else [str(videos.spec)]
    return out


def _demo(data_cfg, heldout: bool) -> NamedVideos:
    spec = [str(p) for p in ensure_demo_videos(data_cfg.demo, heldout=heldout)]
    return NamedVideos(HELDOUT_KEY if heldout else TRAINING_KEY, spec,
                       f"demo-{data_cfg.demo.kind}{'-heldout' if heldout else ''}",
                       str(demo_dir(data_cfg.demo, heldout)), demo=True)


def _given(key: str, spec: Any) -> NamedVideos:
    """A config's own set: a path or URI is named by its last part; a list by its first video's folder."""
    spec = _plain(spec)
    if isinstance(spec, str):
        return NamedVideos(key, spec, _last(spec) or spec, spec)
    first = str(spec[0]) if spec else "."
    folder = first.rsplit("/", 1)[0] if "/" in first else "."
    return NamedVideos(key, spec, f"{_last(folder)} ({len(spec)} videos)", folder)


def _plain(spec: Any) -> Any:
    return OmegaConf.to_container(spec, resolve=True) if OmegaConf.is_config(spec) else spec


def _last(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]
