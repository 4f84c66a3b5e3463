"""Starting or joining Ray on the driver, the same way for `raystream train` and `raystream sweep`.

`RAY_ADDRESS` set (or Ray already initialised): join that cluster as it is. Otherwise a local cluster is started
(never one found through Ray's `/tmp/ray/ray_current_cluster`, which names the last `ray start` of the host)
whose node address is the loopback interface, so the GCS address and the node Ray advertises are local only; the
dashboard keeps Ray's default host, 127.0.0.1. Ray turns `ray.init(_node_ip_address="127.0.0.1")` into the host's
address; what it does honour is its single-machine mode, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (the default on
Windows and macOS), read when Ray is imported: `loopback_only()` sets it, and the CLI calls it before anything
imports Ray. In that mode Ray's GCS, raylet, core workers and agents bind 127.0.0.1 too (without it, their gRPC
servers listen on `::`); torch.distributed's store, which Ray does not place, is bound by
`raystream/train/loopback.py` (docs/operations.md, "Files and services").

Ray forwards every worker's output to the driver's terminal, raystream's progress lines among them, and with them
lines of Ray's own machinery that tell a raystream user nothing (the `PlacementGroupCleaner`'s tracebacks when
several Ray instances share a host, which raystream/tune/release.py makes up for; the `PreemptionWatcher` error;
the raylet's worker-count warnings; the TrainController's "Failed to send resource request ..." warning with its
`GetTimeoutError` traceback, which Ray itself calls safe to ignore when the CPU is busy). `start_ray` drops those
from the forwarded output; they stay in Ray's logs
under /tmp/ray. This wraps Ray's private log dispatcher (`ray._private.ray_logging`); where a Ray version lacks
it, nothing is filtered.

On the driver's terminal (`quiet_terminal`, unless `--verbose`): Ray's token-authentication notice (a local
cluster is bound to loopback; raystream has nothing for the user to do about it) is dropped, and where the output
is no terminal (a log file, a pipe) Ray's colour codes are left out, from its own log lines and from the
`(RayTrainWorker pid=...)` prefixes of forwarded output (Ray's `RAY_COLOR_PREFIX=0`).

A local cluster's processes are told where its own dashboard is (`RAY_API_SERVER_ADDRESS`, set before the
cluster starts, so its raylet and workers inherit it). Ray's State API client otherwise finds "the" cluster of the
host: with several Ray instances it takes the last `ray start`'s, and with one it takes whatever answers on the
recorded dashboard port. Ray Train's `PlacementGroupCleaner` asks that API whether the run's controller is alive
and, when another cluster's dashboard says it does not know the controller, removes the placement group of a live
run: the run dies with `ActorDiedError` the moment a neighbour cluster starts (`start_local_ray`).

A local cluster that `start_ray` starts is guarded (raystream/train/guard.py): none of its processes outlives the
command, whether it finishes, fails, is interrupted or its driver is killed. A joined one (`RAY_ADDRESS`, or a
Ray the process had initialised) is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from typing import Any, Dict, Optional

from raystream.train.guard import guard_local_ray

# Forwarded worker output that is Ray's internal noise: whole batches of these actors, and lines with these marks.
NOISY_ACTORS = ("PlacementGroupCleaner",)
NOISY_MARKS = ("'PreemptionWatcher'", "worker processes have been started")
# Forwarded warnings dropped with the traceback that follows them.
NOISY_WARNINGS = ("Failed to send resource request for",)
_CHAIN = ("Traceback (most recent call last)", "During handling of the above exception",
          "The above exception was the direct cause")


# Ray's driver loggers whose lines a raystream user has nothing to do about (unless --verbose).
QUIET_LOGGERS = ("ray._private.authentication",)
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
COLOUR_PREFIX_ENV = "RAY_COLOR_PREFIX"  # Ray's: "0" = forwarded output's `(name pid=...)` prefix without colour


SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's flag: "0" = node address 127.0.0.1
API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"  # Ray's: the dashboard its State API client asks, before any discovery


def loopback_only() -> None:
    """For a local run (no `RAY_ADDRESS`): make the Ray this process starts use 127.0.0.1 as its node address.
    Call before `ray` is imported; a value the user set is kept."""
    if not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault(SINGLE_MACHINE_ENV, "0")


class _TerminalNoise(logging.Filter):
    """On the handlers of Ray's `ray` logger: drops the QUIET_LOGGERS' records and, unless the handler writes to a
    terminal, the colour codes of the others."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(QUIET_LOGGERS):
            return False
        message = record.getMessage()
        if "\x1b[" in message and not _is_terminal(getattr(self, "stream", None)):
            record.msg, record.args = _COLOUR.sub("", message), None
        return True


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


def quiet_terminal() -> None:
    """What `raystream train` and `raystream eval` show of Ray on the terminal without `--verbose` (module
    docstring): call before Ray starts; a `RAY_COLOR_PREFIX` the user set is kept."""
    import ray  # noqa: F401  lazy, after loopback_only: importing Ray sets up the `ray` logger's handlers

    if not (_is_terminal(sys.stdout) and _is_terminal(sys.stderr)):  # forwarded output goes to either
        os.environ.setdefault(COLOUR_PREFIX_ENV, "0")
    for handler in logging.getLogger("ray").handlers:
        if not any(isinstance(f, _TerminalNoise) for f in handler.filters):
            noise = _TerminalNoise()
            noise.stream = getattr(handler, "stream", None)
            handler.addFilter(noise)


def start_ray() -> None:
    """`ray.init()` for a raystream driver: the cluster of `RAY_ADDRESS`, else a local one bound to loopback whose
    processes end with the command (raystream/train/guard.py). A Ray this process already initialised is kept as
    it is."""
    import ray  # lazy: `loopback_only` must set the environment before Ray is first imported

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        guard_local_ray()  # the cluster started here ends with the command, however it ends (train/guard.py)
        start_local_ray()
    _filter_forwarded_output()


def start_local_ray(**init_kwargs: Any) -> None:
    """Start a new local Ray (`ray.init(address="local", **init_kwargs)`) whose processes query its own dashboard's
    State API, on a free loopback port, whether or not `include_dashboard=False` leaves that port closed (then
    Ray Train's cleaner finds nothing to ask and leaves the run alone). This process keeps the setting."""
    import ray  # lazy, as in start_ray

    port = _free_loopback_port()
    os.environ[API_SERVER_ENV] = f"http://127.0.0.1:{port}"
    ray.init(address="local", dashboard_port=port, **init_kwargs)


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def without_ray_noise(data: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A batch of forwarded worker output without Ray's internal noise; None when nothing is left."""
    if data.get("actor_name") in NOISY_ACTORS:
        return None
    lines = [line for line in _without_noisy_warnings(data.get("lines", []))
             if not any(mark in line for mark in NOISY_MARKS)]
    return dict(data, lines=lines) if lines else None


def _without_noisy_warnings(lines):
    """`lines` without each NOISY_WARNINGS line and the traceback after it (to its last exception line)."""
    kept, i = [], 0
    while i < len(lines):
        if not any(mark in lines[i] for mark in NOISY_WARNINGS):
            kept.append(lines[i])
            i += 1
            continue
        i += 1
        in_traceback = i < len(lines) and lines[i].startswith(_CHAIN[0])
        while in_traceback and i < len(lines):
            line = lines[i]
            i += 1
            if line and not line[0].isspace() and not line.startswith(_CHAIN):  # the exception line
                after = i
                while after < len(lines) and not lines[after].strip():
                    after += 1
                in_traceback = after < len(lines) and lines[after].startswith(_CHAIN)  # a chained exception
                if in_traceback:
                    i = after
    return kept


def _filter_forwarded_output() -> None:
    try:
        # a private Ray API an older / newer Ray may lack: imported inside the try
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return
    name = "ray_print_logs"  # the handler ray.init installs (log_to_driver) and ray.shutdown removes
    printers = [handler for n, handler in dispatcher.handlers if n == name]
    if len(printers) != 1:
        return
    printer = printers[0]

    def filtered(data: Dict[str, Any]) -> None:
        kept = without_ray_noise(data)
        if kept is not None:
            printer(kept)

    dispatcher.remove_handler(name)
    dispatcher.add_handler(name, filtered)
