"""Peak memory of the two phases of a run that `raystream bench` measures: the stream correlation a run takes
before step 0, and the training steps with one checkpoint save.

Device (`device` figures). CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (tensors only:
not the CUDA context, nor what the caching allocator holds beyond them). CPU: the device is the host, see below.

Host (`host` figures, and the device figures on CPU): the process's peak resident set during the phase (VmHWM,
reset before it where Linux allows, `/proc/self/clear_refs`; else `resource.getrusage`'s peak since the process
started) less the resident set before the model was built (`rss()`, the baseline: Python, torch and its libraries,
the config). So on CPU a figure is what the run adds to the process: model, optimizer state, gradients, activations,
the checkpoint's copies, the stream's decode threads and frames, and what the C allocator keeps of freed memory.
"""

from __future__ import annotations

import resource
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from omegaconf import OmegaConf

from raystream.data import build_stream
from raystream.train import checkpoint
from raystream.train.correlation import measure_model

GIB = float(1 << 30)


def _status(field: str) -> Optional[int]:
    """A `/proc/self/status` memory field (VmRSS, VmHWM) in bytes (Linux), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_vm_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _getrusage_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def rss() -> int:
    """The process's resident set now (bytes): the baseline, taken before the model is built."""
    now = _status("VmRSS")
    return now if now is not None else _getrusage_peak()


class PeakMemory:
    """`start()` before a phase, `stop()` after: (device peak, host peak) in bytes in between, the host one above
    `baseline`; `how` says what was measured."""

    def __init__(self, device: torch.device, baseline: int):
        self.device = device
        self.baseline = int(baseline)
        self.how = ""

    def start(self) -> None:
        if _reset_vm_hwm() and _status("VmHWM") is not None:
            host = "peak RSS (VmHWM, reset before the phase)"
        else:
            host = "peak RSS since the process started (getrusage)"
        host += f" above the {self.baseline / GIB:.2f} GiB resident before the model was built"
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.how = f"cuda max_memory_allocated (tensors); host: {host}"
        else:
            self.how = f"cpu {host}"

    def stop(self) -> Tuple[int, int]:
        hwm = _status("VmHWM") if "VmHWM" in self.how else None
        host = max(0, (hwm if hwm is not None else _getrusage_peak()) - self.baseline)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device)), host
        return host, host


@dataclass
class Phase:
    """What one phase measured: (device, host) peak bytes."""

    device: int
    host: int

    def figures(self, prefix: str) -> Dict[str, Any]:
        """`{prefix}peak_memory_bytes/_gb` (device) and `{prefix}host_peak_memory_bytes/_gb`."""
        return {f"{prefix}peak_memory_bytes": self.device, f"{prefix}peak_memory_gb": self.device / GIB,
                f"{prefix}host_peak_memory_bytes": self.host, f"{prefix}host_peak_memory_gb": self.host / GIB}


def measured(meter: PeakMemory, phase: Callable[[], Any]) -> Tuple[Phase, Any]:
    """(the peaks while `phase()` runs, what it returned)."""
    meter.start()
    out = phase()
    return Phase(*meter.stop()), out


def correlation(trainee, pairs: int = 1) -> Dict[str, Any]:
    """The stream correlation as a run's worker measures it before step 0 (raystream/train/correlation.py
    `measure_model`): at the fresh model (no optimizer state yet), in micro-batches of the per-worker batch, under
    the step's autocast, on one worker's shard (a global batch of the per-worker batch, world size 1), `pairs` pairs
    of batches per order (a run's `trainer.correlation_steps`): what it holds does not grow with them (at most 3
    gradients), its time does. Returns its figures; raises ValueError when the stream has no consecutive pair of
    such batches."""
    cfg = OmegaConf.merge(trainee.cfg, {"stream": {"batch_size": trainee.batch_size}})
    base = build_stream(cfg.data, cfg.stream)
    try:
        return measure_model(trainee.model, cfg, base, steps=max(1, pairs), device=trainee.device,
                             micro_batch=trainee.batch_size, autocast=trainee.autocast)
    finally:
        base.close()


def save_checkpoint(trainee) -> int:
    """One checkpoint as rank 0 writes it (raystream/train/loop.py `report_with_checkpoint`: the model's and the
    optimizer's state dicts, the previous gradient of grad_cos_prev, torch.save) into a temporary directory,
    removed after; its bytes on disk."""
    diagnostics = trainee.cosines.diagnostics_state_dict() if trainee.cosines is not None else {}
    with tempfile.TemporaryDirectory(prefix="raystream-bench-ckpt-") as d:
        checkpoint.save(Path(d), model_state=trainee.model.state_dict(),
                        train_state={"optimizer": trainee.optimizer.state_dict(), "diagnostics": diagnostics},
                        meta={"next_step": trainee.t})
        return sum(p.stat().st_size for p in Path(d).iterdir())
