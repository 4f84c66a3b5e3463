"""Faults a test injects into a run from outside its step: a `Faults` object handed to
`fit(cfg, options=RunOptions(step_hooks=Faults(...)))` (or `commands.main`, `eval_job.run`), pickled to the
workers, where it wraps the batches before they reach the loop (`around_steps`) and delays the evaluations
(`eval_delay_s`). The training code reads no environment for them: `raystream train` / `raystream eval`
(raystream/cli.py) translate the documented environment variables below into a `Faults` (`from_env`), so
`RAYSTREAM_FAIL_AT_STEP=1 raystream train ...` (the rehearsal, docs/paper-scale.md) keeps working. How a run
handles the signals that stop it is `raystream.train.signals`.

    fail_at_step=k        RAYSTREAM_FAIL_AT_STEP=k: the worker of rank `fail_rank` (RAYSTREAM_FAIL_RANK, default 0)
                          raises FaultInjected just before training step k, once per run: a marker file records
                          that it fired, so the restarted worker (and a re-run of the same run name) goes past
                          step k.
    fail_marker=path      RAYSTREAM_FAIL_MARKER=path: the marker file (default: `.fault_injected_step<k>` in the
                          run directory when it is local, else in the system temp dir).
    pause_at_step=k       RAYSTREAM_PAUSE_AT_STEP=k: the worker of rank 0 pauses just before training step k (so
                          every checkpoint before step k is on storage): it creates the file `pause_file` and
                          waits until that file is removed, then trains on. A test acts on the run at a known
                          step (signals its driver, breaks its storage or tracking server, reads its
                          listeners) instead of racing a fixed delay, and removes the file to let the run
                          go on (or leaves it, when the run is to be stopped there). A worker that reaches
                          step k again (restarted) pauses again; one that finds the file already there
                          waits for its removal all the same.
    pause_file=path       RAYSTREAM_PAUSE_FILE=path: the file of the pause (required with pause_at_step).
    pause_timeout_s=s     RAYSTREAM_PAUSE_TIMEOUT_S=s: the longest pause (default 120 s): then the worker raises
                          PauseTimedOut naming the hook and the file, so no run (and no test) waits forever.
    step_delay_s=s        RAYSTREAM_STEP_DELAY_S=s: every worker sleeps s seconds per step (to keep a run going).
    eval_delay_s=s        RAYSTREAM_EVAL_DELAY_S=s: every worker that evaluates sleeps s seconds in each
                          evaluation, before its probes (a long probe, e.g. longer than
                          trainer.collective_timeout_s).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional

from raystream.train import persist

PAUSE_TIMEOUT_S = 120.0
PAUSE_POLL_S = 0.05


class FaultInjected(RuntimeError):
    """Raised by the fault-injection hook; Ray Train treats it like any worker failure and restarts."""


class PauseTimedOut(RuntimeError):
    """Raised by the pause hook when nobody removed its file in time (a test that never acted on the pause)."""


def from_env(run_dir_local: Optional[str] = None, run_name: Optional[str] = None,
             environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The hooks the environment variables above ask for (`environ`, default this process's), as plain settings
    (`Faults(**settings)`); the failure's default marker is placed for the run when `run_name` is given (else
    `Faults.for_run` places it). Called by the CLI only: the training code reads no environment."""
    env = os.environ if environ is None else environ
    hooks: Dict[str, Any] = {}
    if env.get("RAYSTREAM_FAIL_AT_STEP"):
        hooks.update(fail_at_step=int(env["RAYSTREAM_FAIL_AT_STEP"]),
                     fail_rank=int(env.get("RAYSTREAM_FAIL_RANK", "0")))
        if env.get("RAYSTREAM_FAIL_MARKER"):
            hooks["fail_marker"] = env["RAYSTREAM_FAIL_MARKER"]
    if env.get("RAYSTREAM_PAUSE_AT_STEP"):
        if not env.get("RAYSTREAM_PAUSE_FILE"):
            raise ValueError("RAYSTREAM_PAUSE_AT_STEP is set without RAYSTREAM_PAUSE_FILE (the file the paused "
                             "worker creates and waits on)")
        hooks.update(pause_at_step=int(env["RAYSTREAM_PAUSE_AT_STEP"]), pause_file=env["RAYSTREAM_PAUSE_FILE"],
                     pause_timeout_s=float(env.get("RAYSTREAM_PAUSE_TIMEOUT_S", PAUSE_TIMEOUT_S)))
    if env.get("RAYSTREAM_STEP_DELAY_S"):
        hooks["step_delay_s"] = float(env["RAYSTREAM_STEP_DELAY_S"])
    if env.get("RAYSTREAM_EVAL_DELAY_S"):
        hooks["eval_delay_s"] = float(env["RAYSTREAM_EVAL_DELAY_S"])
    return with_marker(hooks, run_dir_local, run_name) if run_name is not None else hooks


def with_marker(hooks: Dict[str, Any], run_dir_local: Optional[str], run_name: str) -> Dict[str, Any]:
    """`hooks` with the failure's marker file: its own, else `.fault_injected_step<k>` in the run directory when it
    is local (`run_dir_local`), else in the system temp dir."""
    if hooks.get("fail_at_step") is None or hooks.get("fail_marker"):
        return hooks
    base = Path(run_dir_local) if run_dir_local else Path(tempfile.gettempdir()) / f"raystream-{run_name}"
    return {**hooks, "fail_marker": str(base / f".fault_injected_step{hooks['fail_at_step']}")}


class Faults:
    """The hooks of one run, injected from outside its step:
    `fit(cfg, options=RunOptions(step_hooks=Faults(fail_at_step=2)))`.
    Picklable (plain settings, the keys of the module docstring); `fit` places the failure's marker for the run
    (`for_run`), the workers wrap their batches with `around_steps` and delay each evaluation by `eval_delay_s`.
    Another hook object works the same way where it has these three."""

    def __init__(self, **settings: Any):
        if settings.get("pause_at_step") is not None and not settings.get("pause_file"):
            raise ValueError("pause_at_step is set without pause_file (the file the paused worker creates and waits "
                             "on)")
        self.settings = {k: v for k, v in settings.items() if v is not None}

    def __repr__(self) -> str:
        return f"Faults({', '.join(f'{k}={v!r}' for k, v in self.settings.items())})"

    @property
    def eval_delay_s(self) -> float:
        return float(self.settings.get("eval_delay_s", 0.0))

    def for_run(self, run_dir_local: Optional[str], run_name: str) -> "Faults":
        """These hooks with the failure's marker placed for run `run_name` (`with_marker`)."""
        return Faults(**with_marker(self.settings, run_dir_local, run_name))

    def around_steps(self, batches: Iterable, rank: int, total: int) -> Iterable:
        """`batches` with the hooks applied before each of the run's steps reaches the loop: the training step
        itself carries no test code."""
        return around_steps(batches, self.settings, rank, total)


def around_steps(batches: Iterable, hooks: Optional[Dict[str, Any]], rank: int, total: int) -> Iterable:
    """`batches` with `hooks` (settings) applied before each of the run's steps; without any, the batches as they
    are."""
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
        pause(Path(hooks["pause_file"]), step, float(hooks.get("pause_timeout_s", PAUSE_TIMEOUT_S)))
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
    # Written beside it, then linked in: whoever sees the file sees its whole text (an `open(path, "x")` shows an
    # empty file until the write lands).
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    draft.write_text(f"paused before step {step} on rank 0 (pid {os.getpid()}): remove this file to go on\n")
    try:
        os.link(draft, path)
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    deadline = time.monotonic() + timeout_s
    while path.exists():
        if time.monotonic() > deadline:
            raise PauseTimedOut(f"RAYSTREAM_PAUSE_AT_STEP={step}: paused before step {step} on rank 0 for "
                                f"{timeout_s:g} s (RAYSTREAM_PAUSE_TIMEOUT_S) and nobody removed {path}")
        time.sleep(PAUSE_POLL_S)
