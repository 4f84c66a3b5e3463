"""The `raystream` command: `--cfg job` prints the composed config; a bad override exits 2 with the key named; a bad
input of a run is named before Ray starts.

One bad override runs as a real `python -m raystream.cli` process (its exit status 2, no traceback); the other checks
run `raystream.cli.main` in this process (`cli` below, tests/cli_driver.py), whose return value is the process's
exit status (`sys.exit(main())`): as subprocesses they cost 5-17 CPU-seconds each, mostly imports (torch, MLflow,
Hydra, Ray)."""

import subprocess
import sys

import pytest
from cli_driver import in_process


def _run(*args):
    return subprocess.run([sys.executable, "-m", "raystream.cli", *args], capture_output=True, text=True)


@pytest.fixture
def cli(tmp_path, monkeypatch, capfd):
    """`cli(*args, env=None)`: `raystream <args>` in this process, in tmp_path (cli_driver.in_process)."""
    with in_process(tmp_path, monkeypatch, capfd) as run:
        yield run


def test_cfg_job_prints_composed_config(cli):
    out = cli("train", "optimizer=adamw", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "name: adamw" in out.stdout


def test_bad_override_fails_before_ray_with_key():
    """A real process: its exit status and stderr, with no traceback."""
    out = _run("train", "stream.order=sideways")
    assert out.returncode == 2
    assert "stream.order" in out.stderr
    assert "Traceback" not in out.stderr


def test_inspect_rejects_zero_world_size_and_batches(cli):
    for flag in ("--world-size", "--batches"):
        out = cli("data", "inspect", flag, "0")
        assert out.returncode == 2 and flag in out.stderr and "expected an integer >= 1" in out.stderr


def test_an_unreachable_tracking_server_fails_before_ray_starts(cli, tmp_path):
    out = cli("train", env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "http://127.0.0.1:1" in out.stderr and "Traceback" not in out.stderr
    assert "Ray" not in out.stdout + out.stderr.replace("raystream", "")  # no Ray started
    assert not (tmp_path / "raystream_results").exists()


def test_own_videos_without_eval_dataset_fail_before_ray_starts(cli, tmp_path):
    out = cli("train", f"data.videos=[{tmp_path / 'a.mp4'}]")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "eval.dataset" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "raystream_results").exists()


def test_eval_of_a_directory_without_a_checkpoint_fails_before_ray_starts(cli, tmp_path):
    out = cli("eval", str(tmp_path))
    assert out.returncode == 2 and "no checkpoint in it" in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # no MLflow store, no results directory


def test_report_of_a_missing_experiment_leaves_no_store_behind(cli, tmp_path):
    out = cli("report", "--experiment", "missing")
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


@pytest.mark.parametrize("command, what", [(["train"], "the run's inputs"),
                                           (["sweep", "sweep=smoke"], "sweep `smoke`'s inputs"),
                                           (["pretrain-start"], "the run's inputs")])
def test_every_bad_input_of_a_run_is_reported_together_without_resume_advice(cli, tmp_path, command, what):
    """A bad data.videos, a probe set that cannot be listed and a missing start checkpoint: one message names
    all three, before Ray starts, with no "re-run with trainer.run_name=... to resume it" (nothing started); the
    same for a sweep (each problem with the cells it concerns) and for `pretrain-start`."""
    ssv2 = tmp_path / "ssv2"  # labels and train split, no validation split under either name
    ssv2.mkdir()
    (ssv2 / "something-something-v2-labels.json").write_text('{"Holding something": "0"}')
    (ssv2 / "something-something-v2-train.json").write_text("[]")
    out = cli(*command, f"data.videos=[{tmp_path / 'a.mp4'}]", f"eval.dataset={ssv2}",
                  f"scenario.backbone.init={tmp_path / 'start.pt'}", f"trainer.storage_path={tmp_path / 'results'}")
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr
    assert f"3 problems with {what}" in err and "Traceback" not in err
    assert f"`data.videos`: 1 of 1 videos not found: {tmp_path / 'a.mp4'}" in err
    assert "looked for something-something-v2-validation.json and validation.json" in err
    assert "scenario.backbone.init" in err
    assert "resume" not in out.stdout + err and "re-run" not in out.stdout + err
    assert "Ray" not in out.stdout + err.replace("raystream", "")  # no Ray started


def test_rays_token_notice_and_colour_codes_stay_off_a_log_unless_verbose():
    """What `raystream train` does before Ray starts (`quiet_terminal`), then Ray's own token-authentication
    notice, its coloured dashboard line and a forwarded worker line, written into a pipe: without it (as before,
    and with --verbose) they carry the notice and raw colour codes; with it, neither."""
    script = """
import logging, sys
from raystream.train import ray_start
ray_start.loopback_only()
if sys.argv[1] == "quiet":
    ray_start.quiet_terminal()
from ray._private import worker
import colorama  # Ray's copy (ray puts its third-party files on the path)
from ray._private.authentication import authentication_token_setup as auth
auth._warn_token_auth_enabled()
logging.getLogger("ray._private.worker").info(
    "Started a local Ray instance. View the dashboard at %s%shttp://127.0.0.1:8265 %s%s",
    colorama.Style.BRIGHT, colorama.Fore.GREEN, colorama.Fore.RESET, colorama.Style.NORMAL)
worker.print_worker_logs({"pid": 7, "actor_name": "RayTrainWorker", "ip": "127.0.0.1", "localhost": "127.0.0.1",
                          "is_err": False, "lines": ["[run] step 4/4"]}, sys.stdout)
"""
    import os

    env = {k: v for k, v in os.environ.items() if k != "RAY_COLOR_PREFIX"}
    loud, quiet = (subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, env=env,
                                  timeout=120) for mode in ("verbose", "quiet"))
    assert loud.returncode == 0 and quiet.returncode == 0, loud.stderr[-2000:] + quiet.stderr[-2000:]
    loud_text, quiet_text = loud.stdout + loud.stderr, quiet.stdout + quiet.stderr
    assert "Token authentication" in loud_text and "\x1b[" in loud_text  # what the test would catch
    assert "Token authentication" not in quiet_text and "\x1b[" not in quiet_text
    assert "View the dashboard at http://127.0.0.1:8265" in quiet_text
    assert "(RayTrainWorker pid=7) [run] step 4/4" in quiet_text
