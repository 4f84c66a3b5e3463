"""Peak memory of the training steps `raystream bench` times.

CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (tensors only: not the CUDA context, nor
what the caching allocator holds beyond them). CPU: the process's peak resident set (VmHWM), reset before the
steps where Linux allows it (`/proc/self/clear_refs`), else `resource.getrusage`'s peak since the process started;
on CPU it counts the whole process: model, optimizer, the stream's decode threads and their frames, Python.
"""

from __future__ import annotations

import resource
import sys
from typing import Optional

import torch

GIB = float(1 << 30)


def _vm_hwm() -> Optional[int]:
    """VmHWM of this process in bytes (Linux), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
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


class PeakMemory:
    """`start()` before the steps, `stop()` after: the peak bytes in between; `how` says what was measured."""

    def __init__(self, device: torch.device):
        self.device = device
        self.how = ""

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.how = "cuda max_memory_allocated"
        elif _reset_vm_hwm() and _vm_hwm() is not None:
            self.how = "cpu peak RSS (VmHWM, reset before the steps)"
        else:
            self.how = "cpu peak RSS since the process started (getrusage)"

    def stop(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        if "VmHWM" in self.how:
            return int(_vm_hwm())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux
