"""URIs of object stores (s3://bucket/key, gs://bucket/key) opened as pyarrow filesystems: the one place that
turns a URI into (filesystem, path) for results (`trainer.storage_path`) and videos (`data.videos` and the other
video inputs), and that opens files in them (`read_bytes`, `read_file`, `write_bytes`, `open_output`, `download`),
local or remote alike.

Every process resolves a URI itself, with its own credentials (instance profile, service account) and endpoint
(`AWS_ENDPOINT_URL`, e.g. an S3-compatible server), as pyarrow reads them. Errors are `UriError` with a one-line
reason; each caller names its own config key around it.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple


class UriError(ValueError):
    """A URI that cannot be opened; the message is one line saying why."""


def is_uri(text: Any) -> bool:
    """Whether `text` names an object store (`scheme://...`), not a local path (`file://` is local)."""
    s = str(text).strip()
    return "://" in s and not s.startswith("file://")


def filesystem_of(uri: str) -> Tuple[Any, str]:
    """(pyarrow filesystem, path inside it: bucket/key) of `uri`. Raises UriError on an unknown scheme, a URI
    without a bucket, or a filesystem pyarrow cannot set up (region, credentials)."""
    import pyarrow.fs as pafs  # lazy: pyarrow is heavy, and only object stores (and train/) need it

    scheme, _, rest = uri.partition("://")
    if not scheme or not rest.strip("/"):
        raise UriError("no bucket: expected a bucket after the scheme")
    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # pyarrow: ArrowInvalid (unknown scheme), OSError (no such filesystem / region)
        raise UriError(first_line(exc)) from None


def filesystem_at(where: str) -> Tuple[Any, str]:
    """(pyarrow filesystem, path) of `where`: an object-store URI (`filesystem_of`) or a local path."""
    import pyarrow.fs as pafs  # lazy: pyarrow is heavy, and only object stores (and train/) need it

    if is_uri(where):
        return filesystem_of(where)
    return pafs.LocalFileSystem(), os.path.abspath(where)


def is_file(fs, path: str) -> bool:
    """Whether `path` is a file (an object) of pyarrow filesystem `fs`."""
    import pyarrow.fs as pafs  # lazy: pyarrow is heavy, and only object stores (and train/) need it

    return fs.get_file_info(path).type == pafs.FileType.File


def read_bytes(fs, path: str) -> bytes:
    """The whole file `path` of pyarrow filesystem `fs` (the filesystem's OSError when it is missing)."""
    with fs.open_input_stream(path) as f:
        return f.read()


def read_file(fs, path: str) -> Optional[bytes]:
    """The whole file `path` of `fs`, or None when there is no file there."""
    return read_bytes(fs, path) if is_file(fs, path) else None


def open_output(fs, path: str):
    """A stream writing file `path` of `fs` anew (a context manager; the object is stored when it closes)."""
    return fs.open_output_stream(path)


def write_bytes(fs, path: str, data: bytes) -> None:
    """Write `data` as the whole file `path` of `fs` (replacing it)."""
    with open_output(fs, path) as f:
        f.write(data)


def download(fs, path: str, local: str, chunk_bytes: int = 8 << 20) -> Tuple[int, Any]:
    """Copy file `path` of `fs` to the local file `local` in chunks of `chunk_bytes`, in one read of the object:
    (bytes written, the object's metadata as the store gave it with that read, e.g. its ETag)."""
    got = 0
    with fs.open_input_stream(path) as src, open(local, "wb") as dst:
        meta = src.metadata() or {}
        while chunk := src.read(chunk_bytes):
            dst.write(chunk)
            got += len(chunk)
    return got, meta


def uri_of(scheme: str, fs_path: str) -> str:
    """The URI of `fs_path` (bucket/key) in a filesystem opened from a `scheme` URI."""
    return f"{scheme}://{fs_path.lstrip('/')}"


def path_in_store(uri: str) -> str:
    """bucket/key of an object `uri`, as `filesystem_of` gives it (without opening a filesystem)."""
    return uri.partition("://")[2].partition("?")[0].lstrip("/")


def bucket_uri(uri: str) -> str:
    """`scheme://bucket` of `uri` (with its query options): the URIs of one filesystem."""
    head, sep, query = uri.partition("?")
    return f"{head.partition('://')[0]}://{path_in_store(head).split('/', 1)[0]}{sep}{query}"


def first_line(exc: BaseException, max_chars: Optional[int] = None) -> str:
    """`Type: first line of the message` of an exception from a filesystem or a service (their messages run to many
    lines), the message cut at `max_chars` when given."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:max_chars]}" if text else type(exc).__name__
