"""Where results live: `trainer.storage_path`, a local directory or a URI (s3://bucket/prefix, gs://bucket/prefix),
resolved by this one module for `raystream train` and `raystream sweep` alike.

    uri(value)     -> str       what Ray's `RunConfig(storage_path=...)` gets: an absolute local path or the URI as
                                given (no I/O; for messages)
    resolve(value) -> Storage   the same, plus the pyarrow filesystem raystream's own bookkeeping files go through
                                (the run's MLflow run id, the sweep's parent run); checks the place can be reached

Ray is handed the string, never a filesystem object: every node resolves it with its own credentials (instance
profile, service account) and endpoint (`AWS_ENDPOINT_URL`, e.g. an S3-compatible server), exactly as pyarrow
and Ray do. Local paths are made absolute here, on the driver, because trials and workers run in other
directories. A URI that cannot be opened, or a bucket that does not exist, fails here with the key named, before
any Ray work starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import pyarrow.fs as pafs

from raystream.config import ConfigError
from raystream.uris import UriError, filesystem_of, first_line, is_uri, read_file, uri_of, write_bytes

DEFAULT = "raystream_results"  # relative to the driver's working directory
KEY = "trainer.storage_path"
EXPECTED = "a local directory or a URI such as s3://bucket/prefix or gs://bucket/prefix"


def uri(value: Optional[str]) -> str:
    """`value` (default `./raystream_results`) as Ray gets it: a URI unchanged (`file://` made a plain path),
    a local path absolute."""
    text = str(value).strip() if value else DEFAULT
    if text.startswith("file://"):
        text = text[len("file://"):]
    if "://" in text:
        scheme, _, rest = text.partition("://")
        return f"{scheme}://{rest.rstrip('/')}"
    return str(Path(text).expanduser().resolve())


@dataclass(frozen=True)
class Storage:
    """One place under the storage root. `uri` for Ray and for people; `filesystem` + `path` for file access."""

    uri: str
    filesystem: Any  # pyarrow.fs.FileSystem
    path: str  # `uri` inside `filesystem` (bucket/prefix for object stores)

    @property
    def local(self) -> bool:
        return "://" not in self.uri

    def child(self, *names: str) -> "Storage":
        tail = "/".join(n.strip("/") for n in names)
        return Storage(f"{self.uri}/{tail}", self.filesystem, f"{self.path.rstrip('/')}/{tail}")

    def uri_of(self, fs_path: Optional[str]) -> Optional[str]:
        """A path inside this filesystem (what Ray's `Result.path` / `Checkpoint.path` hold) as a URI."""
        if fs_path is None or self.local or "://" in fs_path:
            return fs_path
        return uri_of(self.uri.partition("://")[0], fs_path)

    def read_json(self, name: str) -> Optional[Dict[str, Any]]:
        """The JSON file `name` here, or None when it is missing or unreadable."""
        path = f"{self.path}/{name}"
        try:
            data = read_file(self.filesystem, path)
            return None if data is None else json.loads(data.decode())
        except (OSError, ValueError):
            return None

    def write_json(self, name: str, data: Dict[str, Any]) -> None:
        self.filesystem.create_dir(self.path, recursive=True)
        write_bytes(self.filesystem, f"{self.path}/{name}", json.dumps(data, indent=1, sort_keys=True).encode())


def resolve(value: Optional[str]) -> Storage:
    """The storage root `value` (`trainer.storage_path`), opened and checked: for an object store, its bucket
    must exist and answer (a missing bucket or missing credentials fails here, naming the key)."""
    where = uri(value)
    if not is_uri(where):
        return Storage(where, pafs.LocalFileSystem(), where)
    try:
        fs, path = filesystem_of(where)
    except UriError as exc:
        raise ConfigError(f"config key `{KEY}` = {value!r}: cannot open it ({exc}); expected {EXPECTED}") from None
    bucket = path.split("/", 1)[0]
    try:
        found = fs.get_file_info(bucket).type
    except Exception as exc:  # unreachable endpoint, refused credentials
        raise ConfigError(f"config key `{KEY}` = {value!r}: cannot reach bucket {bucket!r} "
                          f"({first_line(exc)}); check the credentials and AWS_ENDPOINT_URL / the network") from None
    if found == pafs.FileType.NotFound:
        raise ConfigError(f"config key `{KEY}` = {value!r}: bucket {bucket!r} does not exist (create it first)")
    return Storage(where, fs, path)

