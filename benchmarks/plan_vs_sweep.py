"""Does `raystream plan` get a small sweep's wall time within 1.5x? (issue 68 item 3)

Runs, in a fresh directory (its own MLflow store and results):
  1. a small sweep (sweep=smoke, seed 0: 4 trials of a few steps), which leaves finished trials;
  2. `raystream plan sweep` of the same sweep at seed 1 (4 new trials): its time now comes from the finished trials
     of the same sweep (their start, stream correlation, evaluations and checkpoints included);
  3. that sweep itself, timed;
and prints the plan's wall time against the sweep's: the command's and its parent run's (the time the trials ran,
Ray's start excluded), with their ratios. Before this issue the plan's time held the training steps alone (a
10-trial sweep planned at 6.3 s took 353 s).

    .venv/bin/python benchmarks/plan_vs_sweep.py [--steps 6] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _raystream(args, cwd, env):
    started = time.time()
    out = subprocess.run([sys.executable, "-m", "raystream.cli", *args], cwd=cwd, env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"raystream {' '.join(args)} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out, time.time() - started


def _parent_seconds(uri: str, run_name: str) -> float:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("plan_vs_sweep")
    (run,) = client.search_runs([experiment.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    return (run.info.end_time - run.info.start_time) / 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="trainer.max_steps of each trial (default 6)")
    parser.add_argument("--keep", default=None, help="a directory to run in and keep (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="plan_vs_sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    common = ["sweep=smoke", f"trainer.max_steps={args.steps}", "mlflow.experiment=plan_vs_sweep",
              f"trainer.storage_path={work / 'results'}"]
    try:
        _, first_s = _raystream(["sweep", *common, "sweep.grid.trainer.seed=[0]"], work, env)
        second = [*common, "sweep.grid.trainer.seed=[1]"]
        planned, _ = _raystream(["plan", "sweep", *second, "--json"], work, env)
        plan = json.loads(planned.stdout)
        ran, second_s = _raystream(["sweep", *second], work, env)
        run_name = next(line.split()[1].rstrip(":") for line in ran.stdout.splitlines()
                        if line.startswith("sweep smoke-") and "trials finished" in line)
        parent_s = _parent_seconds(uri, run_name)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    wall = plan["wall_s"]["estimate"] if plan.get("wall_s") else float("nan")
    print(f"first sweep (4 trials, seed 0): {first_s:.0f} s; what the plan's time of the second includes: "
          f"{plan['not_included']}")
    print(f"plan of the second (4 trials, seed 1): {wall:.1f} s ({plan['wall_s']['low']:.1f} to "
          f"{plan['wall_s']['high']:.1f})")
    print(f"second sweep: command {second_s:.1f} s (ratio to the plan {second_s / wall:.2f}), its parent run "
          f"{parent_s:.1f} s (ratio {parent_s / wall:.2f}); the target: within 1.5x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
