"""A `raystream train` driver started as a subprocess by a test, and waiting on it (or on a `raystream sweep`)."""

import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Sequence


@contextmanager
def train_process(overrides: Sequence[str], env: Dict[str, str], cwd: Path, stderr_file: Path) -> Iterator:
    """`raystream train <overrides>` running in `cwd` with `env`, its stderr in `stderr_file`; killed when the block
    ends (whatever the test asserted)."""
    with open(stderr_file, "w") as stderr:
        driver = subprocess.Popen([sys.executable, "-m", "raystream.cli", "train", *overrides], env=env, cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            yield driver
        finally:
            driver.kill()
            driver.wait()


def wait_for(driver, stderr_file, ready, timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    """Poll `ready()` while `driver` (a Popen) runs: fail naming its exit code and stderr if it exits first, or
    "`what` within `timeout_s` s" if `ready()` is still false by then."""
    deadline = time.time() + timeout_s
    while not ready():
        assert driver.poll() is None, f"driver exited early with {driver.returncode}: {stderr_file.read_text()}"
        assert time.time() < deadline, f"{what} within {timeout_s} s"
        time.sleep(poll_s)
