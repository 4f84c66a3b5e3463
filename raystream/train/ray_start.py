"""Starting or joining Ray on the driver, the same way for `raystream train` and `raystream sweep`.

`RAY_ADDRESS` set (or Ray already initialised): join that cluster as it is. Otherwise a local cluster is started
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
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

# Forwarded worker output that is Ray's internal noise: whole batches of these actors, and lines with these marks.
NOISY_ACTORS = ("PlacementGroupCleaner",)
NOISY_MARKS = ("'PreemptionWatcher'", "worker processes have been started")
# Forwarded warnings dropped with the traceback that follows them.
NOISY_WARNINGS = ("Failed to send resource request for",)
_CHAIN = ("Traceback (most recent call last)", "During handling of the above exception",
          "The above exception was the direct cause")


SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's flag: "0" = node address 127.0.0.1


def loopback_only() -> None:
    """For a local run (no `RAY_ADDRESS`): make the Ray this process starts use 127.0.0.1 as its node address.
    Call before `ray` is imported; a value the user set is kept."""
    if not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault(SINGLE_MACHINE_ENV, "0")


def start_ray() -> None:
    """`ray.init()` for a raystream driver: the cluster of `RAY_ADDRESS`, else a local one bound to loopback."""
    import ray  # lazy: `loopback_only` must set the environment before Ray is first imported

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init()
    _filter_forwarded_output()


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
