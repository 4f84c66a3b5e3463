"""The `raystream` command: `--cfg job` prints the composed config; a bad override exits 2 with the key named."""

import subprocess
import sys


def _run(*args):
    return subprocess.run([sys.executable, "-m", "raystream.cli", *args], capture_output=True, text=True)


def test_cfg_job_prints_composed_config():
    out = _run("train", "optimizer=adamw", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "name: adamw" in out.stdout


def test_bad_override_fails_before_ray_with_key():
    out = _run("train", "stream.order=sideways")
    assert out.returncode == 2
    assert "stream.order" in out.stderr
    assert "Traceback" not in out.stderr


def _run_in(cwd, *args, env=None):
    import os

    full = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "raystream.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=full, timeout=120)


def test_inspect_rejects_zero_world_size_and_batches():
    for flag in ("--world-size", "--batches"):
        out = _run("data", "inspect", flag, "0")
        assert out.returncode == 2 and flag in out.stderr and "expected an integer >= 1" in out.stderr


def test_an_unreachable_tracking_server_fails_before_ray_starts(tmp_path):
    out = _run_in(tmp_path, "train", env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "http://127.0.0.1:1" in out.stderr and "Traceback" not in out.stderr
    assert "Ray" not in out.stdout + out.stderr.replace("raystream", "")  # no Ray started
    assert not (tmp_path / "raystream_results").exists()


def test_own_videos_without_eval_dataset_fail_before_ray_starts(tmp_path):
    out = _run_in(tmp_path, "train", f"data.videos=[{tmp_path / 'a.mp4'}]")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "eval.dataset" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "raystream_results").exists()


def test_eval_of_a_directory_without_a_checkpoint_fails_before_ray_starts(tmp_path):
    out = _run_in(tmp_path, "eval", str(tmp_path))
    assert out.returncode == 2 and "no checkpoint in it" in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # no MLflow store, no results directory


def test_report_of_a_missing_experiment_leaves_no_store_behind(tmp_path):
    out = _run_in(tmp_path, "report", "--experiment", "missing")
    assert out.returncode == 2 and "no MLflow store" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_make_clean_removes_every_file_raystream_writes_in_the_working_directory(tmp_path):
    """The README's "Files and services" list: mlflow.db, mlruns/, raystream_results/, reports/ (and pip's egg-info)."""
    import shutil
    from pathlib import Path

    makefile = Path(__file__).resolve().parents[1] / "Makefile"
    written = ["mlflow.db", ".mlflow.db.1.2.tmp", "mlruns/0/meta.yaml", "raystream_results/run/x.json",
               "reports/smoke/report.md", "raystream.egg-info/PKG-INFO"]
    for rel in written:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / "mine.txt").write_text("the user's")
    out = subprocess.run([shutil.which("make"), "-f", str(makefile), "clean"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
