"""`raystream train`, as a terminal user sees it: the run's name and place first, then its figures and the command
that resumes it, or one message saying why it ended (no traceback) with the exit code a scheduler reads.
`raystream pretrain-start` ends its run the same way (`said_why_it_ended`)."""

from __future__ import annotations

import shlex
import signal
import sys
from typing import Any, Optional, Sequence

from omegaconf import DictConfig

from raystream.config import ConfigError
from raystream.data import DataError
from raystream.tracking import names
from raystream.tracking.store import tracking_uri
from raystream.train import storage as results
from raystream.train.divergence import DivergedError
from raystream.train.run import RunOptions, TrackingUnavailable, default_run_name, fit


def resume_command(name: str, overrides: Optional[Sequence[str]]) -> str:
    """The command line that resumes run `name`: the same overrides, with its `trainer.run_name`."""
    if overrides is None:
        return f"raystream train <same overrides> trainer.run_name={shlex.quote(name)}"
    kept = [o for o in overrides if not o.lstrip("+~").startswith("trainer.run_name=")]
    return " ".join(["raystream", "train", *map(shlex.quote, kept), shlex.quote(f"trainer.run_name={name}")])


def said_why_it_ended(command: str, exc: BaseException, resume: str) -> int:
    """What a command that fits a run (`raystream train`, `raystream pretrain-start`) says on stderr when `fit`
    raised `exc`, in one message without a traceback, and its exit code: 2 for a bad config or data, 128 + the
    signal when interrupted (with `resume`, the command that resumes it), 1 for a divergence, an unreachable
    tracking store or a failed training (with `resume`)."""
    if isinstance(exc, (ConfigError, DataError)):
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, KeyboardInterrupt):
        signame = getattr(exc, "signal", "SIGINT")
        print(f"{command}: interrupted ({signame}); the MLflow run is marked KILLED. Resume from the last "
              f"checkpoint with:\n  {resume}", file=sys.stderr)
        return 128 + int(getattr(signal, signame, signal.SIGINT))
    if isinstance(exc, DivergedError):
        print(f"{command}: {exc}; the MLflow run is marked FAILED", file=sys.stderr)
        return 1
    if isinstance(exc, TrackingUnavailable):
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    # ray.train.TrainingFailedError and what it wraps
    print(f"{command}: training failed: {type(exc).__name__}: {exc}\nOnce the cause is fixed, resume from the last "
          f"checkpoint with:\n  {resume}", file=sys.stderr)
    return 1


def main(cfg: DictConfig, overrides: Optional[Sequence[str]] = None, step_hooks: Optional[Any] = None) -> int:
    """`raystream train <overrides>`: fit one run, print where its results are. Exit 0, 1 (training failed or
    diverged), 2 (bad config or data) or 130 (interrupted: the resume command is printed). `step_hooks`: as `fit`'s."""
    name = cfg.trainer.run_name or default_run_name(cfg)
    print(f"raystream train: run {name} in {results.uri(cfg.trainer.storage_path)}/{name}", flush=True)
    try:
        final = fit(cfg, run_name=name, options=RunOptions(step_hooks=step_hooks))
    except (Exception, KeyboardInterrupt) as exc:
        return said_why_it_ended("raystream train", exc, resume_command(name, overrides))
    shown = {k: v for k, v in final.items() if k.startswith(names.EVAL_PREFIX) or k == names.LOSS}
    print(f"\nrun {final['run_name']}: {final.get('steps_done', '?')} steps, "
          + ", ".join(f"{k} {v:.4g}" for k, v in sorted(shown.items()) if isinstance(v, (int, float))))
    print(f"  checkpoint  {final['checkpoint_path']}")
    print(f"  MLflow      run {final['mlflow_run_id']} at {tracking_uri(cfg)}  (mlflow ui --backend-store-uri "
          f"{tracking_uri(cfg)})")
    print(f"  resume      {resume_command(final['run_name'], overrides)}")
    return 0
