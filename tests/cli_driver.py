"""A `raystream train` driver started as a subprocess by a test, and waiting on it (or on a `raystream sweep`); and
`raystream ...` run in the test's own process (`in_process`), for the checks that need no process of their own."""

import logging
import os
import re
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


# A line Ray forwards to this process from an actor of the session's cluster (`log_to_driver`): "(Name pid=N) ...",
# its prefix perhaps coloured. Such an actor outlives its test (a detached placement-group cleaner of a killed run
# warns every few seconds that the state API, which needs the dashboard, does not answer), so its lines can land in
# any later command's captured output; they are not the command's.
_FORWARDED = re.compile(r"^(?:\x1b\[[\d;]*m)*\([^()\n]*\bpid=\d+[^()\n]*\)")


def _own_lines(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not _FORWARDED.match(line))


def _ray_running() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


@contextmanager
def in_process(cwd: Path, monkeypatch, capfd) -> Iterator:
    """A function `run(*args, env=None)`: `raystream <args>` by `raystream.cli.main` in this process, in `cwd`, without
    the session's MLFLOW_TRACKING_URI and RAY_ADDRESS (plus `env`); it returns a CompletedProcess of the exit code
    `sys.exit(main())` would give (argparse's SystemExit included) and what the command wrote on stdout and stderr
    (less the lines Ray forwards from the session cluster's actors), and fails if the command started Ray, or shut
    down one this process held. What `main` sets in the environment (`loopback_only`, `--config-dir`) is undone by
    `monkeypatch`, and the filters `quiet_terminal` puts on Ray's log handlers are taken off when the block ends. A
    subprocess of the CLI costs 5-17 CPU-seconds, mostly imports (torch, MLflow, Hydra, Ray); in this process they
    are paid once."""
    from raystream.cli import main
    from raystream.config_tree import ENV as CONFIG_DIR_ENV
    from raystream.train.ray_start import COLOUR_PREFIX_ENV, SINGLE_MACHINE_ENV, _TerminalNoise

    monkeypatch.chdir(cwd)
    for key in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", SINGLE_MACHINE_ENV, COLOUR_PREFIX_ENV, CONFIG_DIR_ENV):
        # recorded by setenv (delenv records only a variable that is set): restored, or removed, afterwards
        monkeypatch.setenv(key, os.environ.get(key, ""))
        if key in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS") or not os.environ[key]:
            monkeypatch.delenv(key)
    ray_before = _ray_running()

    def run(*args: str, env: Dict[str, str] = None) -> subprocess.CompletedProcess:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capfd.readouterr()
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code
        out, err = (_own_lines(text) for text in capfd.readouterr())
        assert _ray_running() == ray_before, "the command started Ray, or shut down the one this process held"
        return subprocess.CompletedProcess(["raystream", *args], rc, out, err)

    before = {h: list(h.filters) for h in logging.getLogger("ray").handlers}
    try:
        yield run
    finally:
        for handler in logging.getLogger("ray").handlers:  # quiet_terminal's filters off again
            handler.filters[:] = before.get(handler, [f for f in handler.filters
                                                      if not isinstance(f, _TerminalNoise)])
