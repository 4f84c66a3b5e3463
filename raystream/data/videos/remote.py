"""Videos in an object store: which objects a URI names, with their sizes, listed where the config is read.

A video input (`data.videos`, `data.heldout_videos`, `eval.dataset`) may be, or contain, URIs (s3://, gs://, any
scheme pyarrow opens, through raystream/uris.py):

    s3://bucket/prefix/            every video object directly under the prefix, sorted by key (as a directory)
    s3://bucket/list.txt | .csv    a manifest object; its relative paths are relative to the manifest's prefix
    s3://bucket/prefix/video.mp4   one object

`list_objects` does the listing (one LIST per prefix, one HEAD per object named on its own) and returns each
object's size and modification time, never its bytes: the node cache (cache.py) downloads what a stream needs.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from raystream.data.errors import DataError
from raystream.uris import (UriError, bucket_uri, filesystem_of, first_line, path_in_store, read_file, uri_of,
                            write_bytes)


@dataclass(frozen=True)
class RemoteObject:
    """One object of a store: its URI and what identifies its version (size, modification time, ETag when
    known)."""

    uri: str
    size: int
    mtime_ns: Optional[int] = None
    etag: Optional[str] = None

    @property
    def name(self) -> str:
        return posixpath.basename(self.uri)


def open_uri(uri: str, key: str):
    """(filesystem, bucket/key path) of `uri`; a DataError naming `key` when it cannot be opened."""
    try:
        return filesystem_of(uri)
    except UriError as exc:
        raise DataError(f"`{key}` = {uri!r}: cannot open it ({exc}); expected s3://bucket/prefix/, "
                        "gs://bucket/prefix/, a manifest or a video object") from None


def parent_uri(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[0]


def join_uri(base: str, relative: str) -> str:
    """`relative` (a manifest's line) resolved against the prefix URI `base`; URIs stay as they are."""
    if "://" in relative:
        return relative
    scheme, _, rest = base.partition("://")
    return f"{scheme}://{posixpath.normpath(posixpath.join(rest, relative))}"


def list_prefix(uri: str, key: str, extensions: Sequence[str], recursive: bool = False) -> List[RemoteObject]:
    """The objects under the prefix `uri` whose names end in one of `extensions`, sorted by key."""
    import pyarrow.fs as pafs  # lazy: pyarrow is heavy, and only a URI (an object store) needs it

    fs, path = open_uri(uri, key)
    scheme = uri.partition("://")[0]
    try:
        infos = fs.get_file_info(pafs.FileSelector(path.rstrip("/"), recursive=recursive, allow_not_found=True))
    except Exception as exc:  # unreachable endpoint, refused credentials, no such bucket
        raise DataError(f"`{key}` = {uri!r}: cannot list it ({first_line(exc)}); check the credentials, "
                        "AWS_ENDPOINT_URL / the network and the bucket name") from None
    found = [RemoteObject(uri_of(scheme, i.path), int(i.size), i.mtime_ns) for i in infos
             if i.type == pafs.FileType.File and posixpath.splitext(i.path)[1].lower() in extensions]
    return sorted(found, key=lambda o: o.uri)


def stat_objects(uris: Sequence[str], key: str) -> Dict[str, Optional[RemoteObject]]:
    """Each URI's object (size, mtime), or None where no object has that key."""
    import pyarrow.fs as pafs  # lazy: pyarrow is heavy, and only a URI (an object store) needs it

    out: Dict[str, Optional[RemoteObject]] = {u: None for u in uris}
    by_bucket: Dict[str, List[str]] = {}  # one filesystem (one region lookup) per bucket, not one per object
    for u in uris:
        by_bucket.setdefault(bucket_uri(u), []).append(u)
    for bucket, items in by_bucket.items():
        fs, _ = open_uri(items[0], key)
        try:
            infos = fs.get_file_info([path_in_store(u) for u in items])
        except Exception as exc:  # noqa: BLE001 - the store's own error, named with the first object
            raise DataError(f"`{key}`: cannot reach {items[0]!r} ({first_line(exc)}); check the credentials, "
                            "AWS_ENDPOINT_URL / the network and the bucket name") from None
        for u, info in zip(items, infos):
            if info.type == pafs.FileType.File:
                out[u] = RemoteObject(u, int(info.size), info.mtime_ns)
    return out


def read_text(uri: str, key: str) -> Optional[str]:
    """The object `uri` as text, or None when it does not exist."""
    fs, path = open_uri(uri, key)
    try:
        data = read_file(fs, path)
        return None if data is None else data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"`{key}`: cannot read {uri!r} ({first_line(exc)})") from None


def write_text(uri: str, text: str, key: str) -> None:
    fs, path = open_uri(uri, key)
    try:
        write_bytes(fs, path, text.encode())
    except OSError as exc:
        raise DataError(f"cannot write {uri!r} ({first_line(exc)}): the index needs write access to the "
                        "bucket (workers only read)") from None
