"""A write that failed for want of space, named: which path, how much it needed, how much was free.

A full disk reaches raystream in three guises: `OSError(ENOSPC)` from a plain write or flush, `OSError(EDQUOT)`
(a quota), and torch.save's `RuntimeError` from its zip writer ("[enforce fail at inline_container.cc:...]
unexpected pos ..." or "basic_ios::clear: iostream error"), which names neither the file nor the disk. `is_full`
tells them apart from other errors and `DiskFull` replaces them with one message a user can act on. Used by the
checkpoint writer (raystream/train/checkpoint.py) and the run's record (raystream/tracking/events.py).
"""

from __future__ import annotations

import errno
import os
import shutil
from typing import Any, Dict, Optional

TORCH_WRITE_FAILED = ("unexpected pos", "basic_ios::clear", "file write failed")


class DiskFull(RuntimeError):
    """Writing `path` failed for want of space; the message says how much it needed and how much was free."""

    def __init__(self, path: str, needed: Optional[int], free: Optional[int], cause: str):
        need = f"{_mb(needed)} needed" if needed is not None else "size unknown"
        have = f"{_mb(free)} free" if free is not None else "free space unknown"
        super().__init__(f"no space left to write {path} ({need}, {have} on its disk; {cause}): free space there "
                         f"or choose another trainer.storage_path, then run the same command again to resume")
        self.path, self.needed, self.free = path, needed, free

    def __reduce__(self):  # raised in a Ray worker, read on the driver
        return _rebuild, (str(self), self.path, self.needed, self.free)


def _rebuild(message: str, path: str, needed: Optional[int], free: Optional[int]) -> "DiskFull":
    exc = DiskFull.__new__(DiskFull)
    RuntimeError.__init__(exc, message)
    exc.path, exc.needed, exc.free = path, needed, free
    return exc


def is_full(exc: BaseException) -> bool:
    """Whether `exc` is a write that failed for space (see the module's docstring)."""
    if isinstance(exc, DiskFull):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in TORCH_WRITE_FAILED)


def free_bytes(path: str) -> Optional[int]:
    """Free bytes on the local disk that holds `path` (its nearest existing folder); None when not local."""
    folder = os.path.abspath(path)
    while folder and not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def nbytes(obj: Any) -> int:
    """The bytes of the tensors in `obj` (nested dicts, lists, tuples): about what torch.save of it writes."""
    import torch  # lazy: the record's writer (every CLI command loads it) needs no torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def named(exc: BaseException, path: str, needed: Optional[int], local: bool = True) -> DiskFull:
    """`exc` (a write of `path` that failed for space) as DiskFull, with the free space of `path`'s disk."""
    return DiskFull(path, needed, free_bytes(path) if local else None, f"{type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}")


# ---- no retry: a full disk fails the run once (a restart would redo the steps and fail the same way) ----------------
FULL_KEY = "disk_full"


def as_result(exc: DiskFull) -> Dict[str, Any]:
    """What a worker returns to the driver instead of raising DiskFull (a raise is retried as a worker failure)."""
    return {FULL_KEY: str(exc), "path": exc.path, "needed": exc.needed, "free": exc.free}


def raise_if_full(final: Optional[Dict[str, Any]]) -> None:
    """On the driver: raise the DiskFull a worker returned (`as_result`)."""
    if final and final.get(FULL_KEY):
        raise _rebuild(str(final[FULL_KEY]), final.get("path", ""), final.get("needed"), final.get("free"))


def _mb(n: Optional[int]) -> str:
    return f"{n / 2**20:.1f} MiB" if n is not None else "?"
