"""What each video is (frames, fps, size) before step 0, without decoding it: the per-directory video index, and
`describe_videos`, which every stream and probe set uses to turn listed videos into probed ones.

`raystream data index <uri or path>` writes `raystream-index.json` in each directory (or prefix) that holds the
videos, one record per video: frame count, fps, frame size, and the version it was made from (size, modification
time, ETag where the store gives one). A stream takes a video's record when the listed version matches it (same
size and modification time) and otherwise probes the video, saying so; so with a current index no node downloads
or decodes a video just to learn its length, the driver included. The node cache then checks each download against
the record's ETag, so a video replaced after it was indexed is named instead of streamed.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from raystream.data.errors import DataError
from raystream.data.videos import remote
from raystream.data.videos.cache import NodeCache
from raystream.data.videos.listing import VideoEntry, VideoInfo, class_folders, resolve_videos
from raystream.data.videos.probing import probe_videos
from raystream.uris import is_uri

INDEX_NAME = "raystream-index.json"
FORMAT = 1


def _parent(path: str) -> str:
    return remote.parent_uri(path) if is_uri(path) else os.path.dirname(os.path.abspath(path))


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _version(entry: VideoEntry) -> Optional[Tuple[int, Optional[int]]]:
    """(size, modification time in ns) of the video as listed now; None when it does not exist."""
    if entry.source is not None:
        return entry.source.size, entry.source.mtime_ns
    if is_uri(entry.path):
        return None
    try:
        st = os.stat(entry.path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def read_index(directory: str, key: str) -> Dict[str, dict]:
    """The records of the index in `directory` (a local directory or a prefix URI); {} when there is none."""
    where = f"{directory}/{INDEX_NAME}"
    if is_uri(directory):
        text = remote.read_text(where, key)
    else:
        try:
            with open(where) as f:
                text = f.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise DataError(f"{where}: cannot read the video index ({exc})") from None
    if text is None:
        return {}
    try:
        data = json.loads(text)
        return dict(data["videos"]) if int(data.get("format", 0)) == FORMAT else {}
    except (ValueError, KeyError, TypeError):
        warnings.warn(f"{where}: not a raystream video index (ignored; rewrite it with `raystream data index`)",
                      stacklevel=2)
        return {}


def describe_videos(entries: Sequence[VideoEntry], data_cfg, key: str) -> Tuple[List[VideoInfo],
                                                                                  List[Tuple[str, str]]]:
    """(usable videos in order, [(video, problem)]) of `entries`: from the index where it matches the listed
    version, otherwise probed (a video from an object store is fetched into the node cache first)."""
    indexes = {d: read_index(d, key) for d in sorted({_parent(e.path) for e in entries})}
    results: Dict[int, Tuple[Optional[VideoInfo], Optional[str]]] = {}
    to_probe: List[int] = []
    stale: List[str] = []
    cache = NodeCache.from_config(data_cfg)  # where this node keeps (or will keep) the videos of a store
    for i, e in enumerate(entries):
        version = _version(e)
        if is_uri(e.path) and version is None:
            results[i] = (None, "object not found in the store")
            continue
        if e.source is not None and e.source.size == 0:
            results[i] = (None, "empty object (0 bytes): not a video")
            continue
        record = indexes[_parent(e.path)].get(_name(e.path))
        if record is not None and version is not None and _matches(record, version):
            results[i] = (_from_record(record, e, data_cfg, cache), None)
            continue
        if record is not None:
            stale.append(e.path)
        to_probe.append(i)
    absent = any(problem for _, problem in results.values())
    if absent and str(data_cfg.on_bad_video) == "error":
        to_probe = []  # a missing or empty object ends the stream's build anyway: name it before any download
    remote_probe = [i for i in to_probe if entries[i].source is not None]
    if stale:
        warnings.warn(f"`{key}`: {len(stale)} video(s) changed since their index was written (e.g. {stale[0]}): "
                      "probing them instead; rewrite the index with `raystream data index`", stacklevel=3)
    if remote_probe:
        unindexed = len(remote_probe) - len([p for p in stale if is_uri(p)])
        if unindexed:
            warnings.warn(f"`{key}`: {unindexed} video(s) in the object store have no {INDEX_NAME} record: this node "
                          f"downloads them to count their frames; run `raystream data index` on "
                          f"{_parent(entries[remote_probe[0]].path)} once to skip this", stacklevel=3)
    results.update(_probe(to_probe, entries, data_cfg, cache, data_cfg.fps))
    out_good: List[VideoInfo] = []
    out_bad: List[Tuple[str, str]] = []
    for i, e in enumerate(entries):
        info, problem = results.get(i, (None, None))
        if info is None and problem is None:
            continue  # not probed: another video is missing (data.on_bad_video = error)
        if problem is None:
            out_good.append(info)
        else:
            out_bad.append((e.path, problem))
    _say_pyav_reads(out_good, data_cfg, key)
    return out_good, out_bad


def _say_pyav_reads(videos: Sequence[VideoInfo], data_cfg, key: str) -> None:
    """One warning naming the videos the configured (preferred) decoder would read wrong, which another decoder
    reads instead (exact.py)."""
    configured = str(data_cfg.decoder)
    fallback = [v for v in videos if v.pyav_because and v.decoder(configured) != configured]
    if fallback:
        name = "the preferred decoder" if configured == "auto" else configured
        listing = "\n".join(f"  {v.given}: {v.pyav_because} -> {v.decoder(configured)}" for v in fallback)
        warnings.warn(f"`{key}`: {name} would read {len(fallback)} video(s) wrong; another decoder reads them "
                      f"instead (exact):\n{listing}", stacklevel=3)


def _probe(todo: List[int], entries: Sequence[VideoEntry], data_cfg, cache,
           fps_override) -> Dict[int, Tuple[Optional[VideoInfo], Optional[str]]]:
    """{i: (info, None) or (None, problem)} of the entries `todo`, probed (those of a store fetched first)."""
    results: Dict[int, Tuple[Optional[VideoInfo], Optional[str]]] = {}
    for chunk in _chunks(todo, entries, cache):
        keep = [cache.path_of(entries[j].source) for j in chunk if entries[j].source is not None]
        local = [_fetched(cache, entries[i], keep) if entries[i].source is not None else entries[i]
                 for i in chunk]
        good, bad = probe_videos(local, str(data_cfg.decoder), float(data_cfg.decode_timeout_s), fps_override,
                                 str(data_cfg.decode_device))
        by_path = {g.path: g for g in good}
        problems = dict(bad)
        for i, e in zip(chunk, local):
            info = by_path.get(e.path)
            if info is None:
                results[i] = (None, problems.get(e.path, "unusable"))
            else:
                results[i] = (VideoInfo(info.path, info.num_frames, info.fps, info.height, info.width, e.label,
                                        e.source, info.pyav_because, info.decoded_by), None)
    return results


def _fetched(cache, entry: VideoEntry, keep: List[str]) -> VideoEntry:
    """`entry` as the local file the cache holds, its source carrying the ETag the store gave for it."""
    path = cache.fetch(entry.source, keep=keep)
    return VideoEntry(path, entry.label, replace(entry.source, etag=cache.etag_of(entry.source)))


def _chunks(todo: List[int], entries: Sequence[VideoEntry], cache) -> List[List[int]]:
    """`todo` in probe batches: the local files at once; those of a store in runs that fit the cache limit (all
    of a batch are on disk while it is probed)."""
    local = [i for i in todo if entries[i].source is None]
    chunks, run, size = ([local] if local else []), [], 0
    limit = cache.limit_bytes if cache is not None and cache.limit_bytes is not None else None
    for i in todo:
        if entries[i].source is None:
            continue
        if run and limit is not None and size + entries[i].source.size > limit:
            chunks.append(run)
            run, size = [], 0
        run.append(i)
        size += entries[i].source.size
    return chunks + ([run] if run else [])


def _matches(record: dict, version: Tuple[int, Optional[int]]) -> bool:
    size, mtime_ns = version
    if record.get("size") != size:
        return False
    return mtime_ns is None or record.get("mtime_ns") is None or record["mtime_ns"] == mtime_ns


def _from_record(record: dict, entry: VideoEntry, data_cfg, cache) -> VideoInfo:
    fps = float(data_cfg.fps) if data_cfg.fps else float(record["fps"])
    source = entry.source
    if source is not None and record.get("etag"):  # the node cache checks the download against it
        source = replace(source, etag=str(record["etag"]))
    path = cache.path_of(source) if source is not None else entry.path
    return VideoInfo(path, int(record["num_frames"]), fps, int(record["height"]), int(record["width"]),
                     entry.label, source, record.get("pyav_because"), record.get("decoded_by"))


def write_index(spec, data_cfg, key: str = "data.videos") -> Tuple[List[str], List[Tuple[str, str]]]:
    """Probe every video `spec` names (fetching those in an object store into this node's cache) and write or
    update the index of each directory that holds them. (index files written, [(video, problem)])."""
    entries = resolve_videos(spec, key)
    cache = NodeCache.from_config(data_cfg)
    bad: List[Tuple[str, str]] = []
    todo = []
    for i, e in enumerate(entries):
        if _version(e) is None:
            bad.append((e.path, "not found"))
        elif e.source is not None and e.source.size == 0:
            bad.append((e.path, "empty object (0 bytes): not a video"))
        else:
            todo.append(i)
    results = _probe(todo, entries, data_cfg, cache, None)
    per_dir: Dict[str, Dict[str, dict]] = {}
    for i in todo:
        e, (info, problem) = entries[i], results[i]
        if info is None:
            bad.append((e.path, problem))
            continue
        size, mtime_ns = _version(e)
        per_dir.setdefault(_parent(e.path), {})[_name(e.path)] = {
            "num_frames": info.num_frames, "fps": info.fps, "height": info.height, "width": info.width,
            "size": size, "mtime_ns": mtime_ns, "etag": info.source.etag if info.source is not None else None,
            "pyav_because": info.pyav_because, "decoded_by": info.decoded_by}
    written = []
    for directory, records in sorted(per_dir.items()):
        merged = {**read_index(directory, key), **records}
        text = json.dumps({"format": FORMAT, "videos": merged}, indent=1, sort_keys=True)
        where = f"{directory}/{INDEX_NAME}"
        if is_uri(directory):
            remote.write_text(where, text, key)
        else:
            tmp = f"{where}.part-{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, where)
        written.append(where)
    return written, bad


def main(cfg, videos: str) -> int:
    """`raystream data index VIDEOS`: index the videos (or, for a folder of class sub-folders as `eval.dataset`
    takes, each sub-folder); print each index written and each video that could not be indexed."""
    try:
        try:
            specs = [videos] if resolve_videos(videos, "videos") else []
        except DataError:
            specs = [folder for folder, _ in class_folders(videos, "videos")]
            if not specs:
                raise
        bad: List[Tuple[str, str]] = []
        for spec in specs:
            written, problems = write_index(spec, cfg.data, "videos")
            bad += problems
            for where in written:
                print(f"raystream: wrote {where}")
    except DataError as exc:
        print(f"raystream: {exc}", file=sys.stderr)
        return 2
    for path, problem in bad:
        print(f"raystream: not indexed: {path}: {problem}", file=sys.stderr)
    return 1 if bad else 0
