"""Which video files a config names (`data.videos`, `eval.dataset`), and the facts a checked video carries.

`data.videos` is a list of paths, a directory (its video files, sorted by name) or a manifest (a text file with one
path per line, or a CSV with a `path` column and optional `label`; relative paths are relative to the manifest).
A labelled set (`eval.dataset`) may also be a folder or prefix of class sub-folders (`class_folders`). Nothing here
opens a video: probing.py checks them, index.py reads what an index already knows.
"""

from __future__ import annotations

import csv
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from raystream.data.errors import DataError
from raystream.data.videos import remote
from raystream.data.videos.remote import RemoteObject
from raystream.uris import is_uri

VIDEO_EXTENSIONS = {".mp4", ".m4v", ".mov", ".mkv", ".avi", ".webm", ".mpg", ".mpeg", ".flv", ".wmv", ".ts"}
MANIFEST_EXTENSIONS = {".txt", ".csv", ".lst", ".list"}


@dataclass(frozen=True)
class VideoEntry:
    """One video a config names: a local path, or a URI with its listed object (`source`; None when the store
    has no object with that key)."""

    path: str
    label: Optional[str] = None
    source: Optional[RemoteObject] = None


@dataclass(frozen=True)
class VideoInfo:
    """A probed (or indexed) video. `path` is a local file; for a video from an object store it is the file's
    place in the node cache (cache.py fetches it there before anything opens it) and `source` is the object."""

    path: str
    num_frames: int
    fps: float
    height: int
    width: int
    label: Optional[str] = None
    source: Optional[RemoteObject] = None
    pyav_because: Optional[str] = None  # why the configured (preferred) decoder reads it wrong (decode/exact.py)
    decoded_by: Optional[str] = None  # the decoder the probe found exact for it (None: an index from before)

    def decoder(self, configured: str) -> str:
        """The decoder that reads this video: `configured` (data.decoder) where the probe found it exact; with
        `auto` the one the probe chose; PyAV where the configured one reads it wrong."""
        if configured == "auto" and self.decoded_by:
            return self.decoded_by
        if configured == "pyav" or self.decoded_by == configured:
            return configured
        return "pyav" if self.pyav_because else configured

    @property
    def given(self) -> str:
        """The video as the user named it (what messages and `data inspect` print): the object's URI for a video
        from an object store, not its node-cache path; else the local path."""
        return self.source.uri if self.source else self.path


def resolve_videos(spec, key: str = "data.videos") -> List[VideoEntry]:
    """The videos named by `spec` (list, directory or manifest; local or URIs, see remote.py), in stream order.
    Missing files are kept (probed later, so `on_bad_video=skip` can skip them); a missing directory/manifest or
    an empty listing is a DataError."""
    if spec is None:
        raise DataError(f"`{key}` is empty: give a list of paths, a directory or a manifest file")
    if isinstance(spec, (str, os.PathLike)):
        if is_uri(spec):
            return _with_objects(_resolve_uri(str(spec).strip(), key), key)
        p = Path(os.path.expanduser(str(spec)))
        if p.is_dir():
            entries = [VideoEntry(str(f)) for f in sorted(p.iterdir())
                       if f.is_file() and f.suffix.lower() in VIDEO_EXTENSIONS]
            if not entries:
                raise DataError(f"`{key}` = {str(spec)!r}: the directory holds no video files "
                                f"({', '.join(sorted(VIDEO_EXTENSIONS))})")
            return entries
        if p.suffix.lower() in MANIFEST_EXTENSIONS:
            if not p.is_file():
                raise DataError(f"`{key}` = {str(spec)!r}: manifest file not found")
            return _with_objects(_read_manifest(p.read_text(), str(p), lambda rel: str(p.parent / rel), key), key)
        return [VideoEntry(str(p))]
    entries = [VideoEntry(str(s).strip() if is_uri(s) else os.path.expanduser(str(s))) for s in spec]
    if not entries:
        raise DataError(f"`{key}` is an empty list")
    return _with_objects(entries, key)


def _resolve_uri(uri: str, key: str) -> List[VideoEntry]:
    suffix = posixpath.splitext(uri.rstrip("/"))[1].lower()
    if suffix in MANIFEST_EXTENSIONS and not uri.endswith("/"):
        text = remote.read_text(uri, key)
        if text is None:
            raise DataError(f"`{key}` = {uri!r}: manifest object not found")
        base = remote.parent_uri(uri)
        return _read_manifest(text, uri, lambda rel: remote.join_uri(base, rel), key)
    if suffix in VIDEO_EXTENSIONS and not uri.endswith("/"):
        return [VideoEntry(uri)]
    objects = remote.list_prefix(uri, key, tuple(VIDEO_EXTENSIONS))
    if not objects:
        raise DataError(f"`{key}` = {uri!r}: no video objects under this prefix "
                        f"({', '.join(sorted(VIDEO_EXTENSIONS))}); check the bucket and prefix")
    return [VideoEntry(o.uri, source=o) for o in objects]


def _with_objects(entries: List[VideoEntry], key: str) -> List[VideoEntry]:
    """`entries` with the listed object of every URI (one request per object not listed yet)."""
    todo = [e.path for e in entries if is_uri(e.path) and e.source is None]
    if not todo:
        return entries
    found = remote.stat_objects(todo, key)
    return [VideoEntry(e.path, e.label, found[e.path]) if e.path in found else e for e in entries]


def _read_manifest(text: str, name: str, resolve: Callable[[str], str], key: str) -> List[VideoEntry]:
    """The entries of manifest `name` (its `text`); `resolve` makes a relative line a path or URI (URIs in a
    manifest stay as they are)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise DataError(f"`{key}` = {name!r}: the manifest lists no videos")

    def where(rel: str) -> str:
        rel = rel.strip()
        return rel if is_uri(rel) else resolve(rel)

    if name.lower().endswith(".csv") or "," in lines[0]:
        rows = list(csv.DictReader(lines))
        if not rows or "path" not in rows[0]:
            raise DataError(f"{name}: a CSV manifest needs a `path` column (found {list(rows[0]) if rows else []})")
        return [VideoEntry(where(r["path"]), (r.get("label") or "").strip() or None) for r in rows]
    return [VideoEntry(where(ln)) for ln in lines]


def class_folders(dataset: str, key: str = "eval.dataset") -> List[Tuple[str, str]]:
    """(folder, class name) of each sub-folder of `dataset` (a local folder or a prefix URI) that holds videos."""
    if is_uri(dataset):
        base = dataset.rstrip("/")
        objects = remote.list_prefix(base + "/", key, tuple(VIDEO_EXTENSIONS), recursive=True)
        keys = [o.uri[len(base) + 1:] for o in objects]
        names = sorted({k.split("/")[0] for k in keys if k.count("/") == 1})
        return [(f"{base}/{name}/", name) for name in names]
    root = Path(dataset).expanduser()
    if not root.is_dir():
        return []
    return [(str(d), d.name) for d in sorted(root.iterdir())
            if d.is_dir() and any(f.suffix.lower() in VIDEO_EXTENSIONS for f in d.iterdir())]
