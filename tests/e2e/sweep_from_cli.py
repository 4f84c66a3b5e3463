"""`raystream sweep` then `raystream report`, run from the CLI as a user runs them (a fresh directory, a local Ray
cluster, MLflow in sqlite): the end-to-end sweeps of tests/e2e share it and assert what their table holds. Each
command is a CLI subprocess of its own, or, where a caller passes `in_process`'s `run` (tests/cli_driver.py),
`raystream.cli.main` in the test's process, on the Ray cluster it holds: a driver process costs 5-15 CPU-seconds of
imports. The regime's sweep (tests/e2e/test_regime.py) runs its report as a subprocess, as a user runs it (the suite's
one `raystream report` process; `raystream sweep` runs as a process of its own in tests/e2e/test_e2e_sweep.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Set, Tuple

from mlflow import MlflowClient


def cli_env(**extra: str) -> dict:
    """The environment of a CLI run: this one, less a tracking URI or Ray address a caller may have set."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    return {**env, **extra}


def sweep_and_report(tmp_path: Path, overrides: Sequence[str], env: dict, db: Path, experiment: str,
                     trials: int = 2, cli: Optional[Callable] = None,
                     report_process: bool = False) -> Tuple[List, str, Set[str]]:
    """(the trials' MLflow runs, the report's stdout, the report artifacts logged on the sweep's parent run).
    `cli`: `in_process`'s `run`, to run both commands in this process (`env` then unused) instead of subprocesses;
    `report_process`: the report a subprocess all the same (in `env`)."""
    if cli is None:
        out = subprocess.run([sys.executable, "-m", "raystream.cli", "sweep", *overrides], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
    else:
        out = cli("sweep", *overrides)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{trials} trials finished, 0 failed" in out.stdout
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`raystream.role` = 'trial'")
    assert len(runs) == trials
    report, uri = ["report", "--experiment", experiment, "--out", str(tmp_path / "report")], f"sqlite:///{db}"
    if cli is None or report_process:
        rep = subprocess.run([sys.executable, "-m", "raystream.cli", *report], cwd=tmp_path,
                             env={**env, "MLFLOW_TRACKING_URI": uri}, capture_output=True, text=True, timeout=300)
    else:
        rep = cli(*report, env={"MLFLOW_TRACKING_URI": uri})
    assert rep.returncode == 0, rep.stderr[-3000:]
    parent = client.search_runs([exp.experiment_id], filter_string="tags.`raystream.role` = 'sweep'")[0]
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    return runs, rep.stdout, logged
