"""A run's videos as the plain rows its MLflow dataset inputs digest (tracking/inputs.py records them).

The driver hands tracking what data/ and eval/ resolved, as plain values: each set's context (training, heldout,
probe), name, source and index rows (name, size in bytes, frames or label, URI). The training rows come from the
stream the driver probed anyway, the held-out rows from their listing and directory index, the probe rows from the
probe set's listing: nothing is decoded or downloaded. A set that cannot be listed is said on stderr and left out:
the inputs never stop a run (a listing that fails here fails the run later, where it is read, with its name).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from raystream.data.videos.index import read_index
from raystream.data.videos.listing import resolve_videos
from raystream.tracking.inputs import HELDOUT, PROBE, TRAINING, Row, VideoSet


def video_sets(videos) -> List[VideoSet]:
    """The run's sets (`videos`: its `RunVideos`, train/resolved.py): training, held-out (when given, or the demo's
    when its scenario evaluates on them) and the probe set (`eval.dataset`, when set)."""
    makers = [(TRAINING, lambda: VideoSet(TRAINING, videos.training.name, videos.training.source,
                                          video_rows(videos.probed)))]
    heldout = videos.heldout
    if heldout is not None:
        makers.append((HELDOUT, lambda: VideoSet(HELDOUT, heldout.name, heldout.source,
                                                 listed_rows(heldout.spec, heldout.key))))
    if videos.probe is not None:
        makers.append((PROBE, lambda: VideoSet(PROBE, _name(videos.probe) or videos.probe, videos.probe,
                                               probe_rows(videos.probe))))
    out = []
    for context, make in makers:
        try:
            out.append(make())
        except Exception as exc:  # a listing that fails here fails the run later, where it is read, with its name
            print(f"raystream: WARNING: the {context} videos are not logged as an MLflow dataset input "
                  f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", file=sys.stderr,
                  flush=True)
    return out


def video_rows(videos: Sequence[Any]) -> List[Row]:
    """The index rows of probed videos (`data.videos.listing.VideoInfo`: a stream's videos)."""
    rows = []
    for v in videos:
        uri = v.source.uri if v.source is not None else v.path
        rows.append((_name(uri), _size(v.path, v.source.size if v.source is not None else None), int(v.num_frames),
                     uri))
    return rows


def listed_rows(spec: Any, key: str) -> List[Row]:
    """The index rows of the videos `spec` lists, frame counts from their directory's `raystream-index.json`
    (None where none is recorded): nothing is opened or downloaded."""
    indexes: Dict[str, Dict[str, dict]] = {}
    rows = []
    for e in resolve_videos(spec, key):
        folder = e.path.rsplit("/", 1)[0] if "://" in e.path else os.path.dirname(os.path.abspath(e.path))
        if folder not in indexes:
            try:
                indexes[folder] = read_index(folder, key)
            except Exception:  # an unreadable index: the frame counts stay unknown, the run is not held up
                indexes[folder] = {}
        frames = indexes[folder].get(_name(e.path), {}).get("num_frames")
        rows.append((_name(e.path), _size(e.path, e.source.size if e.source is not None else None),
                     int(frames) if frames is not None else None, e.path))
    return rows


def probe_rows(dataset_spec: str) -> List[Row]:
    """The rows of a probe set (`eval.dataset`): each sample's name, size and class, train samples first."""
    from raystream.eval.labelled_videos import labelled_entries  # lazy: the eval package (torch, PIL)
    from raystream.eval.probe_sets import list_probe_set  # lazy: as above

    listing = list_probe_set(dataset_spec)
    if listing is not None:
        samples = [(s.path, s.source.size if s.source is not None else None, int(s.label))
                   for s in [*listing.train, *listing.test]]
    else:
        samples = [(e.path, e.source.size if e.source is not None else None, e.label)
                   for e in labelled_entries(dataset_spec)]
    return [(_name(p), _size(p, size), label, p) for p, size, label in samples]


def _size(path: str, listed: Optional[int]) -> Optional[int]:
    if listed is not None:
        return int(listed)
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]
