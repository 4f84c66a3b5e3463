"""A decode process's side of processes.py: `python -m raystream.data.decode.processes_child FD`, spawned by
DecodeProcesses with one end of a Unix socket as FD.

It reads its setup (the stream's reader settings, how many readers to keep open, its parent's pid), then one message
per job: (job id, ReaderRecipe, video, frames) with the descriptor of the job's shared-memory segment passed along.
It maps the segment, decodes and crops the frames straight into it (workers.decode_job, as a decode thread does into
its array), and answers (job id, None or the exception) until the parent ends its input; readers stay open per video
(LRU, `max_open`). A child whose parent died sees its socket close or, stuck in a decode, its parent pid change, and
exits.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import socket
import sys
import threading
import time
from collections import OrderedDict
from typing import Optional

import numpy as np

from raystream.data.decode.workers import decode_job
from raystream.data.errors import DataError

MESSAGE_BYTES = 1 << 18  # largest message read from a socket, either way (a job's descriptor is a few KiB)
# the child maps a segment per job: all its pages at once (a third of the CPU of faulting them in one by one)
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def serve(fd: int) -> int:
    """Decode the jobs read from socket `fd` into the memory passed with each, answering (job id, None or the
    exception), until the parent ends its input; readers kept open per video (LRU), as a decode thread keeps them."""
    from raystream.data.decode.backends import open_scaled_reader  # lazy: the child's only heavy import

    sock = socket.socket(fileno=fd)
    setup = pickle.loads(sock.recv(MESSAGE_BYTES))
    settings, max_open = setup["settings"], setup["max_open"]
    r = int(settings.resolution)
    _watch_parent(int(setup["parent"]))
    readers: "OrderedDict[int, object]" = OrderedDict()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
        except OSError:
            break
        if not message:
            break
        job_id, recipe, video, frames = pickle.loads(message)
        error: Optional[BaseException] = None
        try:
            mapping = mmap.mmap(fds[0], len(frames) * 3 * r * r, flags=_MAP_FLAGS)
            try:
                out = np.ndarray((len(frames), 3, r, r), dtype=np.uint8, buffer=mapping)
                decode_job(readers, video, frames, out, lambda: open_scaled_reader(
                    recipe, r, recipe.chosen, settings.max_read_through, settings.decord_reset_frames,
                    settings.device), max_open)
                del out
            finally:
                mapping.close()
        except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it for the stream
            error = _picklable(exc)
        finally:
            for f in fds:
                os.close(f)
        try:
            sock.sendall(pickle.dumps((job_id, error), protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            break
    for reader in readers.values():
        with contextlib.suppress(Exception):
            reader.close()
    return 0


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception whose class does not round-trip
        return DataError(f"{type(exc).__name__}: {exc}")


def _watch_parent(parent: int) -> None:
    """A thread ending this child when its parent died (its parent pid changes) while a decode holds it."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="raystream-decode-parent-watch").start()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
