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
