"""Test hooks that make a run fail, pause or slow down on purpose (read on the driver by `fit`, handed to the
workers). How a run handles the signals that stop it is `raystream.train.signals`.

    RAYSTREAM_FAIL_AT_STEP=k      the worker of rank RAYSTREAM_FAIL_RANK (default 0) raises FaultInjected just
                                  before training step k, once per run: a marker file records that it fired, so
                                  the restarted worker (and a re-run of the same run name) goes past step k.
    RAYSTREAM_FAIL_MARKER=path    the marker file (default: `.fault_injected_step<k>` in the run directory when
                                  it is local, else in the system temp dir).
    RAYSTREAM_PAUSE_AT_STEP=k     the worker of rank 0 pauses just before training step k (so every checkpoint
                                  before step k is on storage): it creates the file RAYSTREAM_PAUSE_FILE and waits
                                  until that file is removed, then trains on. A test acts on the run at a known
                                  step (signals its driver, breaks its storage or tracking server, reads its
                                  listeners) instead of racing a fixed delay, and removes the file to let the run
                                  go on (or leaves it, when the run is to be stopped there). A worker that reaches
                                  step k again (restarted) pauses again; one that finds the file already there
                                  waits for its removal all the same.
    RAYSTREAM_PAUSE_FILE=path     the file of the pause (required with RAYSTREAM_PAUSE_AT_STEP).
    RAYSTREAM_PAUSE_TIMEOUT_S=s   the longest pause (default 120 s): then the worker raises PauseTimedOut naming
                                  the hook and the file, so no run (and no test) waits forever on a pause.
    RAYSTREAM_STEP_DELAY_S=s      every worker sleeps s seconds per step (to keep a run going for a while).
    RAYSTREAM_EVAL_DELAY_S=s      every worker that evaluates sleeps s seconds in each evaluation, before its
                                  probes (a long probe, e.g. longer than trainer.collective_timeout_s).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Optional

from raystream.train import persist

PAUSE_TIMEOUT_S = 120.0
PAUSE_POLL_S = 0.05


class FaultInjected(RuntimeError):
    """Raised by the fault-injection hook; Ray Train treats it like any worker failure and restarts."""


class PauseTimedOut(RuntimeError):
    """Raised by the pause hook when nobody removed its file in time (a test that never acted on the pause)."""


def from_env(run_dir_local: Optional[str], run_name: str) -> Dict[str, Any]:
    """The hooks set in this (driver) process's environment, as plain data for the workers."""
    hooks: Dict[str, Any] = {}
    if os.environ.get("RAYSTREAM_FAIL_AT_STEP"):
        step = int(os.environ["RAYSTREAM_FAIL_AT_STEP"])
        marker = os.environ.get("RAYSTREAM_FAIL_MARKER")
        if not marker:
            base = Path(run_dir_local) if run_dir_local else Path(tempfile.gettempdir()) / f"raystream-{run_name}"
            marker = str(base / f".fault_injected_step{step}")
        hooks.update(fail_at_step=step, fail_rank=int(os.environ.get("RAYSTREAM_FAIL_RANK", "0")), fail_marker=marker)
    if os.environ.get("RAYSTREAM_PAUSE_AT_STEP"):
        if not os.environ.get("RAYSTREAM_PAUSE_FILE"):
            raise ValueError("RAYSTREAM_PAUSE_AT_STEP is set without RAYSTREAM_PAUSE_FILE (the file the paused "
                             "worker creates and waits on)")
        hooks.update(pause_at_step=int(os.environ["RAYSTREAM_PAUSE_AT_STEP"]),
                     pause_file=os.environ["RAYSTREAM_PAUSE_FILE"],
                     pause_timeout_s=float(os.environ.get("RAYSTREAM_PAUSE_TIMEOUT_S", PAUSE_TIMEOUT_S)))
    if os.environ.get("RAYSTREAM_STEP_DELAY_S"):
        hooks["step_delay_s"] = float(os.environ["RAYSTREAM_STEP_DELAY_S"])
    if os.environ.get("RAYSTREAM_EVAL_DELAY_S"):
        hooks["eval_delay_s"] = float(os.environ["RAYSTREAM_EVAL_DELAY_S"])
    return hooks


def around_steps(batches: Iterable, hooks: Optional[Dict[str, Any]], rank: int, total: int) -> Iterable:
    """`batches` with the hooks applied before each of the run's steps reaches the loop: the training step itself
    carries no test code; without hooks (every run but a test's) the batches as they are."""
    if not hooks:
        return batches

    def hooked() -> Iterator:
        for batch in batches:
            if int(batch.step) < total:
                before_step(hooks, int(batch.step), rank)
            yield batch

    return hooked()


def before_step(hooks: Dict[str, Any], step: int, rank: int) -> None:
    """Apply the hooks before training step `step` on worker `rank`."""
    if hooks.get("step_delay_s"):
        time.sleep(hooks["step_delay_s"])
    if hooks.get("pause_at_step") == step and rank == 0:
        persist.wait()  # the checkpoints before step k are on storage in full, as the pause promises
        pause(Path(hooks["pause_file"]), step, float(hooks["pause_timeout_s"]))
    if hooks.get("fail_at_step") != step or hooks.get("fail_rank", 0) != rank:
        return
    marker = Path(hooks["fail_marker"])
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        with open(marker, "x") as f:  # atomic: only the first attempt to reach step k creates it
            f.write(f"fault injected before step {step} on rank {rank}\n")
    except FileExistsError:
        return
    raise FaultInjected(f"RAYSTREAM_FAIL_AT_STEP={step}: injected failure on rank {rank} (marker {marker})")


def pause(path: Path, step: int, timeout_s: float) -> None:
    """Create `path` (unless an earlier attempt's pause left it) and wait until it is removed; PauseTimedOut
    after `timeout_s`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x") as f:
            f.write(f"paused before step {step} on rank 0 (pid {os.getpid()}): remove this file to go on\n")
    except FileExistsError:
        pass
    deadline = time.monotonic() + timeout_s
    while path.exists():
        if time.monotonic() > deadline:
            raise PauseTimedOut(f"RAYSTREAM_PAUSE_AT_STEP={step}: paused before step {step} on rank 0 for "
                                f"{timeout_s:g} s (RAYSTREAM_PAUSE_TIMEOUT_S) and nobody removed {path}")
        time.sleep(PAUSE_POLL_S)
