"""The processes of one `raystream train` driver a test started, and those of them left once its command ended."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Dict, List, Optional

import psutil

MARK_ENV = "RAYSTREAM_TEST_RUN_MARK"  # set by a test in its driver's environment: every process of the run inherits it


class RunProcesses:
    """The processes of the run of driver `pid`: every process below it, noted with its start time whenever `note()`
    runs while it lives (Ray's agents rewrite their environment: they are found this way), every process whose
    environment holds `MARK_ENV=<mark>`, and every process whose command line names `ray_tmp` (given when the run
    has a RAY_TMPDIR of its own: Ray's GCS, raylet and monitors name it)."""

    def __init__(self, pid: int, mark: str, ray_tmp: Optional[Path] = None):
        self.pid, self.mark, self.ray_tmp = pid, mark, str(ray_tmp) if ray_tmp is not None else None
        self.noted: Dict[int, float] = {}

    def note(self) -> None:
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                try:
                    self.noted[child.pid] = child.create_time()
                except psutil.Error:
                    continue
        except psutil.Error:  # the driver is gone
            pass

    def left(self) -> List[str]:
        """'pid name command line' of each live process of the run."""
        found = []
        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        for proc in psutil.process_iter(["pid", "name", "cmdline", "environ", "create_time", "status"]):
            info = proc.info
            if info["pid"] in mine or info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(info["cmdline"] or [])
            if (self.noted.get(info["pid"]) == info["create_time"] or (info["environ"] or {}).get(MARK_ENV) == self.mark
                    or (self.ray_tmp is not None and self.ray_tmp in cmdline)):
                found.append(f"{info['pid']} {info['name']} {cmdline[:160]}")
        return found

    def kill_left(self) -> None:
        """SIGKILL what `left` finds (a test's clean-up, whatever it asserted)."""
        for line in self.left():
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except OSError:
                pass
