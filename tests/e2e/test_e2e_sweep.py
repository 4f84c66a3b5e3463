"""`raystream sweep sweep=smoke` end to end, as a user runs it: the CLI in a fresh directory, a local Ray cluster,
the embedded MLflow store (./mlflow.db), the demo videos, the real Ray Train runs.

One sweep serves every test here (trials are minutes on 2 CPUs): smoke with the order axis collapsed to shuffled
and a second grid axis `scenario: [videomae, broken]`, where `broken` (a scenario group file written by the test:
VideoMAE started from a checkpoint of its own shape whose weights are all NaN) makes its trial fail. Two of the four
cells are excluded (`sweep.exclude`: AdamW's broken one and Orthogonal-AdamW's healthy one; each trial is a Tune
process, a Train run and its helpers), so AdamW's trial trains and Orthogonal-AdamW's broken one fails once its
Train run has started (its loss is NaN at step 0; a corrupt video, or a checkpoint that does not fit the model,
would now stop the whole sweep before Ray starts). It runs one trial at a time, is stopped with SIGTERM (a job
scheduler, `timeout`; raystream handles it as Ctrl+C, with the signal named) once the first trial has finished and
the second has opened its child run, waits, and is started again with the same command, which resumes it (the
interrupted trial goes on in its child run, and fails there): on the session's Ray cluster (`RAY_ADDRESS`, as a user resumes on a cluster; the interrupt is the
one that stops a local Ray of the sweep's own, the resume needs no Ray start of its own: tests/e2e/test_e2e_s3.py
resumes on a local one).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow import MlflowClient

from raystream.config import config_dir

pytestmark = pytest.mark.slow

OVERRIDES = ["sweep=smoke", "stream.order=shuffled", "+sweep.grid.scenario=[videomae,broken]",
             "sweep.max_concurrent_trials=1", "trainer.max_steps=6", "trainer.checkpoint_every=3",
             "trainer.max_failures=0", "eval.probe_epochs=5", "eval.max_probe_samples=100",
             "sweep.exclude=[{optimizer.name: adamw, scenario: broken}, "
             "{optimizer.name: orthogonal_adamw, scenario: videomae}]",
             "trainer.correlation_steps=1"]  # the measurement runs in every trial; its figures are not checked here
# Between the interrupt and the resume: the parent run's duration must not count it. Longer than the 5 s the check
# below allows for start-up, so a counted pause still fails it.
PAUSE_S = 12


def _env(tmp: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env.update(RAYSTREAM_CONFIG_DIR=str(tmp / "sweeps"), PYTHONUNBUFFERED="1", **extra)
    return env


def _children(client, parent_id=None):
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string="tags.`raystream.role` = 'trial'") if experiments else []
    return [r for r in runs if parent_id is None or r.data.tags.get("mlflow.parentRunId") == parent_id]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, ray_cluster):
    tmp = tmp_path_factory.mktemp("e2e")
    shutil.copytree(config_dir(), tmp / "sweeps")
    import math

    import torch

    from raystream.config import compose
    from raystream.models import build_scenario

    videomae_cfg = compose(["scenario=videomae"])
    encoder = build_scenario(videomae_cfg.scenario, videomae_cfg.stream, seed=0).model.encoder
    bad = tmp / "bad.pt"  # fits the backbone (the driver's check passes), diverges at its first step
    torch.save({k: torch.full_like(v, math.nan) for k, v in encoder.state_dict().items()}, bad)
    videomae = (tmp / "sweeps" / "scenario" / "videomae.yaml").read_text()
    assert "  init: random\n" in videomae
    (tmp / "sweeps" / "scenario" / "broken.yaml").write_text(videomae.replace("  init: random\n", f"  init: {bad}\n"))
    cmd = [sys.executable, "-m", "raystream.cli", "sweep", *OVERRIDES]
    db = tmp / "mlflow.db"

    # Phase 1: run until the second trial has its MLflow child run, then SIGTERM. A trial writes its run file
    # (raystream_run.json, in its run directory) once its child run is open, before its Train run's processes
    # start; trials run one at a time, so the first has finished by then. The second is interrupted as soon as it
    # shows what an interrupted trial does (it goes on in the child run it had), and before its Train run costs
    # anything the resume does again. A glob every 0.5 s: no MLflow store opened per poll.
    t0 = time.time()
    log1 = open(tmp / "phase1.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp, env=_env(tmp), stdout=log1, stderr=subprocess.STDOUT)
    run_files = tmp / "raystream_results"
    while time.time() - t0 < 400 and proc.poll() is None and len(list(run_files.glob("*/raystream_run.json"))) < 2:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    rc1 = proc.wait(timeout=180)
    phase1 = time.time() - t0
    client = MlflowClient(f"sqlite:///{db}")
    done = [r for r in _children(client) if r.info.status == "FINISHED"]
    assert len(done) == 1, (tmp / "phase1.log").read_text()[-3000:]
    first = done[0]
    after_interrupt = {r.info.run_id: (r.info.status, r.data.tags.get("raystream.error", ""))
                       for r in _children(client)}
    parent_after_interrupt = client.get_run(first.data.tags["mlflow.parentRunId"])
    locked_after_interrupt = list((tmp / "raystream_results" / "sweeps").glob("*/.raystream_sweep.lock"))
    time.sleep(PAUSE_S)

    # Phase 2: the same command again resumes the sweep (on the session's cluster: no Ray start of its own).
    t1 = time.time()
    out = subprocess.run(cmd, cwd=tmp, env=_env(tmp, RAY_ADDRESS=ray_cluster), capture_output=True, text=True,
                         timeout=900)
    return {"tmp": tmp, "rc1": rc1, "first": first, "out": out, "client": MlflowClient(f"sqlite:///{db}"),
            "phase1_s": phase1, "phase2_s": time.time() - t1, "phase2_start_ms": t1 * 1000,
            "after_interrupt": after_interrupt, "parent_after_interrupt": parent_after_interrupt,
            "locked_after_interrupt": locked_after_interrupt}


def _parent(sweep):
    client = sweep["client"]
    return client.get_run(sweep["first"].data.tags["mlflow.parentRunId"])


def test_interrupted_sweep_resumes_without_redoing_finished_trials(sweep):
    out = sweep["out"]
    assert sweep["rc1"] == 143, (sweep["tmp"] / "phase1.log").read_text()[-3000:]  # 128 + SIGTERM
    phase1 = (sweep["tmp"] / "phase1.log").read_text()
    assert "run the same command again" in phase1 and "Tuner.restore" not in phase1  # one resume hint
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "(resumed)" in out.stdout
    assert "1 trials finished, 1 failed" in out.stdout
    first_trial = sweep["first"].data.tags["raystream.trial_id"]
    runs_of_first = [r for r in _children(sweep["client"]) if r.data.tags["raystream.trial_id"] == first_trial]
    assert len(runs_of_first) == 1  # not run again
    assert runs_of_first[0].info.end_time < sweep["phase2_start_ms"]
    # a trial interrupted by the SIGTERM goes on in the child run it had: no second, empty KILLED run beside it
    per_trial = Counter(r.data.tags["raystream.trial_id"] for r in _children(sweep["client"]))
    assert set(per_trial.values()) == {1}, per_trial
    assert all(r.info.status != "KILLED" for r in _children(sweep["client"]))


def test_failing_trials_are_recorded_and_do_not_stop_the_others(sweep):
    out, parent = sweep["out"], _parent(sweep)
    failed_lines = [line for line in out.stdout.splitlines() if line.startswith("  failed trial ")]
    assert len(failed_lines) == 1, out.stdout[-3000:]
    assert all("'scenario': 'broken'" in line and "is nan at step 0" in line for line in failed_lines), failed_lines
    assert parent.data.tags["raystream.trials_failed"] == "1"
    assert parent.data.tags["raystream.trials_finished"] == "1"
    assert parent.info.status == "FINISHED"


def test_mlflow_parent_and_child_runs(sweep):
    client, parent = sweep["client"], _parent(sweep)
    tags, params = parent.data.tags, parent.data.params
    assert tags["raystream.role"] == "sweep" and tags["raystream.sweep"] == "smoke"
    assert parent.info.run_name == tags["raystream.sweep_run"] and parent.info.run_name.startswith("smoke-")
    assert len(tags["mlflow.source.git.commit"]) >= 7
    assert params["sweep.grid.scenario"] == '["videomae", "broken"]'
    assert params["sweep.collapsed.stream.order"] == "shuffled"
    assert "sweep/smoke.yaml" in {a.path for a in client.list_artifacts(parent.info.run_id, "sweep")}
    children = [r for r in _children(client, parent.info.run_id) if r.info.status == "FINISHED"]
    assert [r.data.tags["raystream.grid.optimizer.name"] for r in children] == ["adamw"]
    assert [r.info.run_name for r in children] == ["adamw-videomae"]
    assert "- `scenario`: videomae, broken" in tags["mlflow.note.content"]
    for child in children:
        assert child.data.params["stream.order"] == "shuffled"
        assert child.data.params["optimizer.name"] == child.data.tags["raystream.grid.optimizer.name"]
        assert {"loss", "eval/knn_top1", "eval/linear_top1"} <= set(child.data.metrics)
        assert len(client.get_metric_history(child.info.run_id, "loss")) == 6
        assert len(client.get_metric_history(child.info.run_id, "grad_cos_prev")) >= 4


def test_report_table_printed_written_and_logged(sweep, monkeypatch, capsys):
    out, parent, tmp = sweep["out"], _parent(sweep), sweep["tmp"]
    lines = out.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| optimizer.name | scenario | n |"))
    assert "eval/knn_top1" in header and header.rstrip().endswith("| last_step_loss |")
    assert any(line.startswith("| adamw | videomae | 1 |") for line in lines)
    assert any(line.startswith("| orthogonal_adamw | broken | 0 (1 failed) |") for line in lines)
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp / 'mlflow.db'}" in out.stdout
    # The last line opens the comparison; Tune's boxed tables and Ray's lines are in the log file, not here.
    link = f"/runs?workflowType=machine_learning&viewStateShareKey={parent.info.run_name}"  # the training workflow
    assert lines[-1].strip().endswith(link), lines[-5:]
    assert "╭" not in out.stdout and "Trial status" not in out.stdout and "INFO" not in out.stdout
    assert len(lines) < 50, out.stdout
    log = next(line for line in lines if "Ray's and Tune's output: " in line).split("output: ")[1].split(" (")[0]
    assert "RayTrainWorker" in Path(log).read_text()  # the workers' output
    report_dir = tmp / "reports" / parent.info.run_name
    report_md = (report_dir / "report.md").read_text()
    assert report_md.count("\n| ") == 3 and "| adamw | broken |" not in report_md  # header + the 2 cells run
    assert (report_dir / "report.csv").exists() and (report_dir / "grad_cos_hist.png").exists()
    logged = {a.path for a in sweep["client"].list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/report.csv", "report/grad_cos_hist.png"} <= logged
    # `raystream report` reads it back from MLflow alone (no Ray), from the embedded store in the working directory:
    # in this process (a driver process of its own is 5-10 CPU-seconds of imports; the CLI's `report` runs as a
    # subprocess in tests/e2e/sweep_from_cli.py).
    from raystream.study.report import main as report_main

    monkeypatch.chdir(tmp)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    capsys.readouterr()
    assert report_main(experiment="raystream", parent=None, out=str(tmp / "again")) == 0
    assert header in capsys.readouterr().out


def test_failed_trials_are_failed_child_runs_with_grid_values_and_reason(sweep):
    client, parent = sweep["client"], _parent(sweep)
    failed = [r for r in _children(client, parent.info.run_id) if r.info.status == "FAILED"]
    assert len(failed) == 1, [(r.info.status, r.data.tags.get("raystream.grid.scenario")) for r in
                              _children(client, parent.info.run_id)]
    for run in failed:
        assert run.data.tags["raystream.grid.scenario"] == "broken"
        assert run.data.tags["raystream.grid.optimizer.name"] == "orthogonal_adamw"  # AdamW's broken cell excluded
        assert run.data.params["optimizer.name"] == "orthogonal_adamw"  # its grid values reached its config
        assert "is nan at step 0" in run.data.tags["raystream.error"], run.data.tags["raystream.error"]
        # its start checkpoint, checked once before Ray started, is named on the trial's run all the same
        assert str(sweep["tmp"] / "bad.pt") in run.data.tags["raystream.init"], run.data.tags


def test_an_interrupt_leaves_no_trial_running_and_the_pause_is_not_counted(sweep):
    parent_then = sweep["parent_after_interrupt"]
    assert parent_then.info.status == "KILLED"
    assert parent_then.data.tags["raystream.error"].startswith("interrupted (SIGTERM"), parent_then.data.tags
    statuses = [status for status, _ in sweep["after_interrupt"].values()]
    assert "RUNNING" not in statuses, sweep["after_interrupt"]
    assert sorted(statuses) == ["FINISHED", "KILLED"], sweep["after_interrupt"]  # the second stopped in its child run
    for status, error in sweep["after_interrupt"].values():  # the stopped trial: interrupted, not ActorDiedError
        assert status != "KILLED" or error.startswith("interrupted (SIGTERM"), sweep["after_interrupt"]
    assert not sweep["locked_after_interrupt"], "the sweep lock was not given back"
    parent = _parent(sweep)
    duration_s = (parent.info.end_time - parent.info.start_time) / 1000
    assert duration_s <= sweep["phase1_s"] + sweep["phase2_s"] + 5, (duration_s, sweep["phase1_s"], sweep["phase2_s"])
    assert float(parent.data.tags["raystream.active_seconds"]) == pytest.approx(duration_s, abs=0.2)
    assert not any(r.info.status == "RUNNING" for r in _children(sweep["client"], parent.info.run_id))
