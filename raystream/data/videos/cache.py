"""The node cache: videos from an object store downloaded once per node, whole, where decoders can open them.

    cache = NodeCache.from_config(data_cfg)
    path = cache.path_of(obj)                 # where `obj` (a remote.RemoteObject) lives on this node
    cache.fetch(obj)                          # download unless a complete copy of this version is there
    with cache.opened(obj) as path: ...       # fetched, and kept from eviction while it is being opened

Layout: `<data.cache_dir>/<scheme>/<bucket>/<key>` (the object's own name, so a stream over the cache is the
stream over a local copy), beside it `<key>.meta.json` (size, modification time and ETag of the version it holds)
and `<key>.lock`. A download goes to `<key>.part-<pid>-<thread>` and is renamed once its size is checked; the meta
file is written after the rename, so a file without one (a crash in between) is fetched again. Every fetch of one
object on one node holds an exclusive `fcntl` lock on its `.lock`, so the workers and trials of a node download it
once and share the copy; opening holds a shared lock, so eviction (which takes the exclusive lock without
waiting) never removes a file while some process is opening it (an open file outlives its removal).

`data.cache_limit_gb` bounds the videos under the root: before a download, cached videos are removed — first those
the caller says its stream has passed, then the least recently used — but never one the caller keeps (the videos
its next steps need). Each download is appended to `<root>/downloads.jsonl` (what this node fetched: its egress).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Set

from raystream.data.cache_root import cache_root
from raystream.data.errors import DataError
from raystream.data.videos.remote import RemoteObject, open_uri
from raystream.uris import download, first_line

_CHUNK = 8 << 20  # bytes per read from the store
_META = ".meta.json"


def default_cache_dir() -> str:
    """`$RAYSTREAM_CACHE_DIR/videos`, else `~/.cache/raystream/videos`: read on the node that downloads."""
    return str(cache_root() / "videos")


class NodeCache:
    """Videos of object stores on this node's disk (see the module docstring)."""

    def __init__(self, root: Optional[str] = None, limit_bytes: Optional[int] = None, retries: int = 3,
                 backoff_s: float = 0.5):
        self.root = Path(os.path.expanduser(str(root))) if root else Path(default_cache_dir())
        self.limit_bytes = limit_bytes
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.bytes_fetched = 0  # by this process, through this object
        self.objects_fetched = 0
        self._warned = False
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, data_cfg) -> "NodeCache":
        limit = data_cfg.cache_limit_gb
        return cls(data_cfg.cache_dir, None if limit is None else int(float(limit) * (1 << 30)),
                   int(data_cfg.download_retries))

    # ------------------------------------------------------------------ where and whether
    def path_of(self, obj: RemoteObject) -> str:
        scheme, _, rest = obj.uri.partition("://")
        return str(self.root / scheme / rest.lstrip("/"))

    def is_fresh(self, obj: RemoteObject) -> bool:
        """A complete copy of this version of `obj` is here (size, modification time and ETag as listed)."""
        path = self.path_of(obj)
        meta = _read_meta(path)
        if meta is None:
            return False
        try:
            size = os.path.getsize(path)
        except OSError:
            return False
        if size != obj.size or meta.get("size") != obj.size:
            return False
        if obj.mtime_ns is not None and meta.get("mtime_ns") is not None and meta["mtime_ns"] != obj.mtime_ns:
            return False
        return not (obj.etag and meta.get("etag") and meta["etag"] != obj.etag)

    def etag_of(self, obj: RemoteObject) -> Optional[str]:
        """The ETag the store gave for the copy held here (None: not cached, or the store gives none)."""
        return (_read_meta(self.path_of(obj)) or {}).get("etag")

    # ------------------------------------------------------------------ fetching
    def fetch(self, obj: RemoteObject, keep: Iterable[str] = (), passed: Iterable[str] = ()) -> str:
        """The local path of `obj`, downloaded first unless a fresh copy is there. `keep`: cached paths the
        caller still needs (never evicted to make room); `passed`: paths its stream is done with (evicted first)."""
        path = self.path_of(obj)
        if self.is_fresh(obj):
            return path
        try:
            with _locked(path + ".lock", fcntl.LOCK_EX):
                if self.is_fresh(obj):  # another worker of this node fetched it while we waited
                    return path
                if self.limit_bytes is not None:
                    self._make_room(obj.size, path, set(keep), list(passed))
                self._download(obj, path)
        except OSError as exc:  # the node's disk, not the store: a cache directory not writable, full or gone
            raise DataError(f"{obj.uri}: cannot keep it in the node cache {self.root} ({first_line(exc)}); "
                            "data.cache_dir must be a writable local directory with room for the videos") from None
        return path

    @contextlib.contextmanager
    def opened(self, obj: RemoteObject, keep: Iterable[str] = (), passed: Iterable[str] = ()) -> Iterator[str]:
        """`obj` fetched, and held from eviction by other processes until the block ends (open it inside)."""
        path = self.fetch(obj, keep, passed)
        for _ in range(self.retries + 1):
            with _locked(path + ".lock", fcntl.LOCK_SH):
                if self.is_fresh(obj):
                    _touch(path)
                    yield path
                    return
            path = self.fetch(obj, keep, passed)  # evicted by another process between fetch and lock
        raise DataError(f"{obj.uri}: evicted from the node cache {self.root} as soon as it was fetched: "
                        "data.cache_limit_gb is too small for the videos the workers of this node use at once")

    def _download(self, obj: RemoteObject, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
        last: Optional[BaseException] = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(10.0, self.backoff_s * 2 ** (attempt - 1)))
            try:
                got, etag = _copy(obj, tmp)
            except DataError:
                _remove(tmp)
                raise
            except Exception as exc:  # noqa: BLE001 - network and store errors are retried, then named
                last = exc
                _remove(tmp)
                continue
            if got != obj.size:  # changed or truncated while being read
                last = OSError(f"read {got} bytes but the object was listed with {obj.size}")
                _remove(tmp)
                continue
            if obj.etag and etag and etag != obj.etag:
                last = OSError(f"ETag {etag} but {obj.etag} was listed (the object changed)")
                _remove(tmp)
                continue
            _remove(path + _META)
            os.replace(tmp, path)
            _write_meta(path, {"uri": obj.uri, "size": obj.size, "mtime_ns": obj.mtime_ns, "etag": etag})
            with self._lock:
                self.bytes_fetched += got
                self.objects_fetched += 1
            _append(self.root / "downloads.jsonl", {"uri": obj.uri, "bytes": got, "pid": os.getpid(),
                                                     "time": time.time()})
            return
        _remove(tmp)
        tries = self.retries + 1
        raise DataError(f"{obj.uri}: download failed after {tries} attempt{'s' if tries > 1 else ''} "
                        f"(data.download_retries = {self.retries}): {first_line(last) if last else 'unknown'}")

    # ------------------------------------------------------------------ the limit
    def cached(self) -> List[Path]:
        """The cached videos under the root (those with a meta file)."""
        return [Path(str(m)[:-len(_META)]) for m in self.root.rglob("*" + _META)]

    def _make_room(self, need: int, replacing: str, keep: Set[str], passed: List[str]) -> None:
        """Evict until `need` more bytes fit; `replacing`'s old copy (a changed object) is not counted: the
        download replaces it."""
        files = []
        for p in self.cached():
            if str(p) == replacing:
                continue
            try:
                files.append((p, p.stat().st_size, p.stat().st_mtime))
            except OSError:
                continue
        used = sum(size for _, size, _ in files)
        if used + need <= self.limit_bytes:
            return
        rank = {p: i for i, p in enumerate(passed)}
        candidates = [f for f in files if str(f[0]) not in keep]
        # what the stream has passed first (in the order it passed them), then the least recently used
        candidates.sort(key=lambda f: (0, rank[str(f[0])], 0.0) if str(f[0]) in rank else (1, 0, f[2]))
        for p, size, _ in candidates:
            if used + need <= self.limit_bytes:
                return
            if _evict(str(p)):
                used -= size
        if used + need > self.limit_bytes and not self._warned:
            self._warned = True
            warnings.warn(f"node cache {self.root}: data.cache_limit_gb = {self.limit_bytes / (1 << 30):g} is "
                          f"smaller than the videos the next steps need ({(used + need) / (1 << 20):.1f} MiB): "
                          "going over it rather than evicting a video that is about to be read", stacklevel=3)


def _copy(obj: RemoteObject, tmp: str):
    """(bytes written to `tmp`, the store's ETag) of one whole read of `obj`."""
    fs, fs_path = open_uri(obj.uri, "data.videos")
    got, meta = download(fs, fs_path, tmp, _CHUNK)
    etag = meta.get("ETag") or meta.get(b"ETag")
    if isinstance(etag, bytes):
        etag = etag.decode()
    return got, (etag.strip('"') if etag else None)


def _evict(path: str) -> bool:
    """Remove the cached video `path` unless some process holds its lock (fetching or opening it)."""
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    try:
        _remove(path + _META)
        _remove(path)
        return True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def _locked(lock_path: str, mode: int) -> Iterator[None]:
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_meta(path: str) -> Optional[dict]:
    try:
        with open(path + _META) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_meta(path: str, meta: dict) -> None:
    tmp = f"{path}{_META}.part-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(meta, f)
    os.replace(tmp, path + _META)


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:  # one short line per write: appends of this size do not interleave
        f.write(json.dumps(record) + "\n")


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
