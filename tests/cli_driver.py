"""Waiting on a `raystream train` or `raystream sweep` driver started as a subprocess by a test."""

import time


def wait_for(driver, stderr_file, ready, timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    """Poll `ready()` while `driver` (a Popen) runs: fail naming its exit code and stderr if it exits first, or
    "`what` within `timeout_s` s" if `ready()` is still false by then."""
    deadline = time.time() + timeout_s
    while not ready():
        assert driver.poll() is None, f"driver exited early with {driver.returncode}: {stderr_file.read_text()}"
        assert time.time() < deadline, f"{what} within {timeout_s} s"
        time.sleep(poll_s)
