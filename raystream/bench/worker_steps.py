"""Two training steps as a Ray Train worker takes them, without Ray: the campaign's `train` phase
(raystream/bench/campaign.py).

The worker's pieces, called as raystream/train/loop.py calls them (that module imports Ray, which a bare GPU machine
lacks): the model, optimizer and schedules built as `Worker.assemble` builds them (bench's `Trainee`), the worker's
shard behind `DeviceStream`, each step's `forward_backward` and `optimizer_update` (step.py) with its values kept on
the device in a `StepWindow` (step.py) and read back once, then rank 0's checkpoint: `checkpoint.snapshot` with
the copy to host memory (what the step waits for when the write runs in Ray Train's upload thread: the save stall)
and `checkpoint.write` (what that thread then does), into a temporary directory. Not run: DDP, Ray's reports.

Host syncs: on CUDA, `torch.cuda.set_sync_debug_mode("warn")` warns at every operation that waits for the device
(`.item()`, `.cpu()`, `nonzero`, ...); the warnings are counted while the steps run and while the window is read.
A worker should sync once per log window (the read-back) and never inside a step. On a CPU there is nothing to
count (`None`).
"""

from __future__ import annotations

import collections
import contextlib
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pyarrow.fs as pafs
import torch

from raystream.bench.trainee import CheckFailed, Trainee, build_device_stream, sync
from raystream.tracking import names
from raystream.train import checkpoint
from raystream.train.step import StepWindow, finite_check_values


class SyncCounter:
    """Counts the host syncs CUDA's sync debug mode warns about inside `counting()`; None on other devices."""

    def __init__(self, device: torch.device):
        self.device = device

    @contextlib.contextmanager
    def counting(self) -> Iterator[List[Any]]:
        if self.device.type != "cuda":
            yield []
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield caught
            finally:
                torch.cuda.set_sync_debug_mode("default")

    def count(self, caught: List[Any]):
        if self.device.type != "cuda":
            return None
        return sum("synchroniz" in str(w.message) for w in caught)

    def sites(self, caught: List[Any], most: int = 12) -> Optional[Dict[str, int]]:
        """The Python lines that synced, most first ({'file.py:line': count}): where to look next time."""
        if self.device.type != "cuda":
            return None
        lines = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                    if "synchroniz" in str(w.message))
        return dict(lines.most_common(most))


def train_steps(cfg, device: torch.device, steps: int = 2) -> Dict[str, Any]:
    """Train `steps` steps from a fresh worker, read them back as one log window, save one checkpoint. Returns the
    figures (seconds, host syncs, checkpoint stall and write, bytes, losses). Raises CheckFailed when a step's loss
    or gradient norm is not finite."""
    began = time.perf_counter()
    trainee = Trainee.build(cfg, device, total_steps=steps)
    stream = build_device_stream(cfg, device, steps)
    built = time.perf_counter()
    window, syncs = StepWindow(1, device), SyncCounter(device)
    try:
        per_step = []  # each step's own: the first one builds the optimizer's state
        batches = iter(stream)
        for _ in range(steps):
            batch = next(batches)
            with syncs.counting() as caught:
                t = trainee.t
                host = trainee.schedules.apply(trainee.optimizer, t)
                out, norm = trainee.forward_backward(batch)
                window.add(t, {names.LOSS: out["loss"]}, {names.GRAD_NORM: norm, **trainee.update()}, host)
            per_step.append(caught)
        in_steps = [w for caught in per_step for w in caught]
        with syncs.counting() as in_read:
            values = window.read()
        sync(device)
    finally:
        stream.close()
    trained = time.perf_counter()
    for t, scalars, metrics in values:
        check = finite_check_values(scalars, metrics)
        if not all(map(_finite, check.values())):
            raise CheckFailed("finite_step", f"step {t}: {check}")
    stall, write_s, size = _checkpoint(trainee)
    return {"steps": len(values), "build_s": built - began, "steps_s": trained - built,
            "losses": [s[names.LOSS] for _, s, _ in values],
            "host_syncs_in_steps": syncs.count(in_steps), "host_syncs_in_read": syncs.count(in_read),
            "host_syncs_per_step": [syncs.count(c) for c in per_step] if device.type == "cuda" else None,
            "host_sync_sites": syncs.sites(in_steps),
            "checkpoint_stall_s": stall, "checkpoint_write_s": write_s, "checkpoint_bytes": size,
            "seconds": time.perf_counter() - began}


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _checkpoint(trainee: Trainee):
    """(the host copy's seconds: the stall; the write's seconds; bytes on disk) of rank 0's checkpoint."""
    diagnostics = trainee.cosines.diagnostics_state_dict() if trainee.cosines is not None else {}
    sync(trainee.device)
    t0 = time.perf_counter()
    snap = checkpoint.snapshot(model_state=trainee.model.state_dict(),
                               train_state={"optimizer": trainee.optimizer.state_dict(), "diagnostics": diagnostics},
                               meta={"next_step": trainee.t}, copy=True)
    stall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="raystream-campaign-ckpt-") as d:
        path = f"{d}/{checkpoint.dir_name(trainee.t)}"
        t1 = time.perf_counter()
        checkpoint.write(pafs.LocalFileSystem(), path, snap)
        write_s = time.perf_counter() - t1
        size = sum(info.size for info in pafs.LocalFileSystem().get_file_info(pafs.FileSelector(path)))
    return stall, write_s, size
