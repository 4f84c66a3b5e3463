"""Does `raystream plan` get a small sweep's wall time within 1.5x? (issue 68 item 3)

Runs, in a fresh directory (its own MLflow store and results):
  1. `raystream bench --json` of the sweep's setting (sweep=smoke's config at its steps), then `raystream plan sweep
     --rate-from` that file for a first run (nothing finished yet): each trial's time is its steps at the bench's
     rate plus its start, correlation, evaluations and checkpoints as the bench measured them
     (raystream/bench/trial_parts.py);
  2. that sweep (seed 0: 4 trials of a few steps), timed; it leaves finished trials;
  3. `raystream plan sweep` of the same sweep at seed 1 (4 new trials): its time now comes from the finished trials
     of the same sweep (their start, stream correlation, evaluations and checkpoints included);
  4. that sweep itself, timed;
and prints each plan's wall time against its sweep's: the command's and its parent run's (the time the trials ran,
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
# sweeps/sweep/smoke.yaml's `fixed`: what its trials run, so the bench measures their setting
SMOKE_FIXED = ["trainer.checkpoint_every=50", "data.demo.num_videos=2", "data.demo.frames_per_video=120",
               "eval.probe_epochs=20", "eval.max_probe_samples=200"]


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
    bench = work / "bench.json"
    try:
        first = [*common, "sweep.grid.trainer.seed=[0]"]
        _raystream(["bench", *SMOKE_FIXED, f"trainer.max_steps={args.steps}", "--device", "cpu", "--steps", "5",
                    "--time-budget", "120", "--json", str(bench)], work, env)
        first_plan = json.loads(_raystream(["plan", "sweep", *first, "--rate-from", str(bench), "--json"],
                                           work, env)[0].stdout)
        first_ran, first_s = _raystream(["sweep", *first], work, env)
        second = [*common, "sweep.grid.trainer.seed=[1]"]
        plan = json.loads(_raystream(["plan", "sweep", *second, "--json"], work, env)[0].stdout)
        ran, second_s = _raystream(["sweep", *second], work, env)
        first_parent_s, parent_s = (_parent_seconds(uri, _run_name(out)) for out in (first_ran, ran))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    for what, p, command_s, run_s in (("a first run, from `raystream bench --json`", first_plan, first_s,
                                       first_parent_s),
                                      ("the sweep extended, from its finished trials", plan, second_s, parent_s)):
        wall = p["wall_s"]["estimate"] if p.get("wall_s") else float("nan")
        print(f"{what}: plan {wall:.1f} s ({p['wall_s']['low']:.1f} to {p['wall_s']['high']:.1f}); the sweep's "
              f"command {command_s:.1f} s (ratio {command_s / wall:.2f}), its parent run {run_s:.1f} s (ratio "
              f"{run_s / wall:.2f}); the target: within 1.5x")
        print(f"  not in the plan's time: {p['not_included']}")
    return 0


def _run_name(out) -> str:
    """The sweep run's name from the line `sweep smoke-<hash>: N trials finished ...` of its output."""
    return next(line.split()[1].rstrip(":") for line in out.stdout.splitlines()
                if line.startswith("sweep smoke-") and "trials finished" in line)


if __name__ == "__main__":
    sys.exit(main())
