"""SIGTERM handled as Ctrl-C, so a job scheduler's stop (`timeout`, `ray job stop`, a cluster's preemption) ends a
run or a sweep as cleanly as Ctrl-C: Ray Train's and Tune's graceful abort, the MLflow run closed KILLED with the
signal named in `raystream.error` (`raystream.tracking.names.interrupted_cause`).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Dict, Iterator


@contextmanager
def sigterm_as_sigint(received: Dict[str, str]) -> Iterator[None]:
    """In this block, SIGTERM runs whatever handles SIGINT (Ray Train's and Tune's graceful abort, else Python's
    KeyboardInterrupt), after recording `received["signal"] = "SIGTERM"`. Only in the main thread (where signal
    handlers live: a Tune trial's `fit` runs in another thread, and its sweep's driver handles the signal)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        received["signal"] = "SIGTERM"
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def raise_if_signalled(received: Dict[str, str]) -> None:
    """After a graceful abort that returned instead of raising: KeyboardInterrupt when a signal was received."""
    if received.get("signal"):
        raise KeyboardInterrupt(received["signal"])
