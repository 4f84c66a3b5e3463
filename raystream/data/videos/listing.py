"""Which video files a config names (`data.videos`), and checking every one of them before a stream starts.

`data.videos` is a list of paths, a directory (its video files, sorted by name) or a manifest (a text file with one
path per line, or a CSV with a `path` column and optional `label`; relative paths are relative to the manifest).

`probe_videos` opens each file with the configured decoder in a child process and decodes its first and last
frames, so a missing, non-video, truncated/corrupt or empty file is reported by name before training; and a file
that makes the decoder hang or abort costs at most `decode_timeout_s` and becomes an error, not a frozen sweep.
A file decord would read wrong (exact.py) is marked for PyAV (`VideoInfo.pyav_because`); see docs/videos.md.
"""

from __future__ import annotations

import csv
import json
import os
import posixpath
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from raystream.data import remote
from raystream.data.errors import DataError
from raystream.data.remote import RemoteObject
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
    pyav_because: Optional[str] = None  # why decord would read this video wrong (exact.py): PyAV reads it then

    def decoder(self, configured: str) -> str:
        """The decoder that reads this video: `configured` (data.decoder), or PyAV where decord reads it wrong."""
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


# ---------------------------------------------------------------------------------------------- probing

_CACHE: Dict[tuple, Tuple[Optional[VideoInfo], Optional[str]]] = {}


def _cache_key(path: str, decoder: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, decoder)


def probe_videos(entries: Sequence[VideoEntry], decoder: str, timeout_s: float,
                 fps_override: Optional[float] = None) -> Tuple[List[VideoInfo], List[Tuple[str, str]]]:
    """(good videos in order, [(path, problem)] for the bad ones). Results are cached per (file, size, mtime)."""
    results: Dict[int, Tuple[Optional[VideoInfo], Optional[str]]] = {}
    todo: List[int] = []
    for i, e in enumerate(entries):
        if not os.path.exists(e.path):
            results[i] = (None, "file not found")
        elif not os.path.isfile(e.path):
            results[i] = (None, "not a regular file")
        elif not os.access(e.path, os.R_OK):
            results[i] = (None, "not readable (permission denied)")
        elif os.path.getsize(e.path) == 0:
            results[i] = (None, "empty file (0 bytes): not a video")
        else:
            key = _cache_key(e.path, decoder)
            if key in _CACHE:
                results[i] = _CACHE[key]
            else:
                todo.append(i)
    for i, res in _probe_in_child([entries[i].path for i in todo], decoder, timeout_s).items():
        results[todo[i]] = res
        key = _cache_key(entries[todo[i]].path, decoder)
        if key is not None:
            _CACHE[key] = res
    good: List[VideoInfo] = []
    bad: List[Tuple[str, str]] = []
    for i, e in enumerate(entries):
        info, problem = results[i]
        if problem is not None:
            bad.append((e.path, problem))
            continue
        fps = float(fps_override) if fps_override else info.fps
        if not fps or fps <= 0:
            bad.append((e.path, "the container gives no frame rate: set data.fps"))
            continue
        good.append(VideoInfo(e.path, info.num_frames, fps, info.height, info.width, e.label,
                              pyav_because=info.pyav_because))
    return good, bad


def _probe_in_child(paths: List[str], decoder: str, timeout_s: float) -> Dict[int, tuple]:
    """Probe `paths` in child processes; a hang past `timeout_s` or a crash marks that file bad and moves on."""
    out: Dict[int, tuple] = {}
    start = 0
    while start < len(paths):
        proc = subprocess.Popen([sys.executable, "-m", "raystream.data.sources", decoder],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        proc.stdin.write(json.dumps(paths[start:]))
        proc.stdin.close()
        lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        current, started = start, False
        while current < len(paths):
            try:  # before the first file the child is still starting Python and importing the decoder
                line = lines.get(timeout=timeout_s if started else timeout_s + 60.0)
            except queue.Empty:
                proc.kill()
                proc.wait()
                out[current] = (None, f"decoding did not finish within data.decode_timeout_s = {timeout_s}s "
                                      "(a stuck decode: the file is likely corrupt)")
                current += 1
                break
            if line is None:  # the child died (e.g. a native abort inside the decoder)
                code = proc.wait()
                out[current] = (None, f"the {decoder} decoder crashed on it (exit code {code}): corrupt file")
                current += 1
                break
            msg = json.loads(line)
            if "started" in msg:
                current, started = start + msg["started"], True
                continue
            i = start + msg["i"]
            if msg.get("error"):
                out[i] = (None, msg["error"])
            else:
                out[i] = (VideoInfo(paths[i], msg["num_frames"], msg["fps"], msg["height"], msg["width"],
                                    pyav_because=msg.get("pyav_because")), None)
            current = i + 1
        else:
            proc.wait()
        start = current
    return out


def _pump(stream, lines: "queue.Queue[Optional[str]]") -> None:
    for line in stream:
        if line.strip():
            lines.put(line)
    lines.put(None)


def _probe_one(path: str, decoder: str) -> dict:
    """Open `path`, decode its first and last frames; a dict with the facts or an `error`.

    The container is read with PyAV first (its FFmpeg messages say what is wrong: no video stream, zero frames,
    invalid data), and its packets must hold the frames the container states (PyAVReader.truncation). With
    data.decoder=decord, decord must then open the file, index it as the container does (exact.misread) and decode
    its first and last frames; where it cannot, PyAV must, and reads the file (`pyav_because` says why).
    """
    from raystream.data.backends import open_reader
    from raystream.data.exact import misread

    opened = []
    try:
        facts = open_reader(path, "pyav", max_read_through=1 << 30)
        opened.append(facts)
        if facts.num_frames <= 0:
            return {"error": "has zero frames"}
        cut = facts.truncation()
        if cut is not None:
            return {"error": f"truncated or corrupt: {cut}"}
        reader, because = facts, None
        if decoder != "pyav":
            try:
                opened.append(open_reader(path, decoder, max_read_through=1 << 30))
                because = misread(opened[-1], facts) or _ends(opened[-1], path)
            except DataError as exc:  # PyAV reads the container, decord cannot
                because = _strip_path(str(exc), path)
            if because is None:
                reader = opened[-1]
        problem = _ends(reader, path) if reader is facts else None
        if problem is not None:
            return {"error": problem}
        return {"num_frames": reader.num_frames, "fps": reader.fps, "height": reader.height, "width": reader.width,
                "pyav_because": because}
    except DataError as exc:
        return {"error": _strip_path(str(exc), path)}
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a property of this file, reported by name
        return {"error": f"unreadable: {type(exc).__name__}: {exc}"}
    finally:
        for r in opened:
            r.close()


def _ends(reader, path: str) -> Optional[str]:
    """What keeps `reader` from reading the video's first and last frames; None when it reads both."""
    n = reader.num_frames
    if n <= 0:
        return "has zero frames"
    if reader.height <= 0 or reader.width <= 0:
        return f"unreadable video stream ({reader.width}x{reader.height} frames)"
    try:
        reader.get([0])
    except DataError as exc:
        return f"unreadable: frame 0 does not decode ({_strip_path(str(exc), path)})"
    try:
        last = reader.get([n - 1])
    except DataError as exc:
        return (f"truncated or corrupt: the container claims {n} frames but frame {n - 1} does not decode "
                f"({_strip_path(str(exc), path)})")
    if last.shape[0] != 1:
        return f"truncated or corrupt: frame {n - 1} of the claimed {n} does not decode"
    return None


def _strip_path(message: str, path: str) -> str:
    return message[len(path) + 2:] if message.startswith(path + ": ") else message


def _child_main() -> None:
    decoder = sys.argv[1]
    __import__("decord" if decoder == "decord" else "av")  # import before the first file's clock starts
    paths = json.loads(sys.stdin.read())
    # a test hook: every file's decode takes at least this long, a stuck decode the tests can rely on
    delay_s = float(os.environ.get("RAYSTREAM_PROBE_DELAY_S", "0"))
    for i, path in enumerate(paths):
        print(json.dumps({"started": i}), flush=True)
        if delay_s:
            time.sleep(delay_s)
        print(json.dumps({"i": i, **_probe_one(path, decoder)}), flush=True)


if __name__ == "__main__":
    _child_main()
