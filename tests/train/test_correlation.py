"""`raystream data correlation` and the run-start measurement (raystream/train/correlation.py) on real demo videos
decoded by decord, real torch gradients, a real MLflow store (sqlite).

The correlated stream: the moving-digits demo with consecutive clips one source frame apart, batches of 2 along
time and a VideoMAE mask fixed for the whole pass (`scenario.mask.mode=fixed`), so consecutive batches hold nearly
the same pixels under the same mask; shuffled batches are random clips of 2 videos.
"""

import json
import subprocess
import sys

import pytest
import torch
from mlflow import MlflowClient

from raystream.config import compose
from raystream.train import correlation


def _tiny(tmp, *extra):
    return ["data.demo.num_videos=2", "data.demo.frames_per_video=90", f"data.demo.cache_dir={tmp / 'demo'}",
            "stream.batch_size=2", "stream.clip_shift=1", "scenario.backbone.depth=1", *extra]


CORRELATED = ("scenario.mask.mode=fixed",)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "raystream.cli", "data", "correlation", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("correlation")


def test_pair_starts_spread_over_the_pass():
    assert correlation.pair_starts(58, 4) == [0, 19, 37, 56]
    assert correlation.pair_starts(3, 8) == [0, 1]  # a short stream: fewer, distinct pairs
    assert correlation.pair_starts(2, 1) == [0]
    assert correlation.pair_starts(1, 4) == []


def test_cli_prints_one_json_line_with_both_orders(demo_dir):
    out = _cli(*_tiny(demo_dir, *CORRELATED), "--steps", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    result = json.loads(lines[0])
    for key in ("sequential", "shuffled", "sequential_raw", "shuffled_raw"):
        assert -1.0 <= result[key] <= 1.0, result
    assert result["order"] == "batch_along_time" and result["scenario"] == "videomae"
    assert result["pairs"] == 3 and result["batch_size"] == 2 and result["clip_shift"] == 1
    assert result["steps"][0] == 0 and result["steps"][-1] == result["steps_per_pass"] - 2
    assert result["weights"] == "random"


def test_sequential_above_shuffled_on_a_correlated_stream(demo_dir):
    torch.set_num_threads(1)
    result = correlation.measure(compose(_tiny(demo_dir, *CORRELATED)), steps=6)
    print("correlated stream:", result)
    assert result["sequential"] > 0.5, result
    assert result["sequential"] > result["shuffled"] + 0.4, result


def test_checkpoint_weights_are_used(demo_dir, tmp_path):
    """The same stream at other weights (a saved state dict of another seed) gives another figure."""
    from raystream.models import build_scenario

    cfg = compose(_tiny(demo_dir, *CORRELATED))
    other = build_scenario(cfg.scenario, cfg.stream, seed=7).model
    torch.save(other.state_dict(), tmp_path / "model.pt")
    base = correlation.measure(cfg, steps=2)
    moved = correlation.measure(cfg, steps=2, checkpoint=str(tmp_path / "model.pt"))
    assert moved["weights"] == str(tmp_path / "model.pt")
    assert moved["sequential_raw"] != base["sequential_raw"]


def test_bad_checkpoint_path_exits_2_naming_it(demo_dir, tmp_path):
    missing = tmp_path / "no-such-run"
    out = _cli(*_tiny(demo_dir), "--steps", "1", "--checkpoint", str(missing))
    assert out.returncode == 2
    assert str(missing) in out.stderr and "no such file" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_stream_of_one_batch_exits_2(demo_dir):
    out = _cli(*_tiny(demo_dir, "stream.batch_size=100"), "--steps", "1")
    assert out.returncode == 2
    assert "consecutive batches need at least 2" in out.stderr and "Traceback" not in out.stderr


def test_zero_steps_exits_2(demo_dir):
    out = _cli(*_tiny(demo_dir), "--steps", "0")
    assert out.returncode == 2 and "--steps 0" in out.stderr


def test_log_correlation_writes_the_figures_to_mlflow(demo_dir, tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("correlation"))
    cfg = compose(_tiny(demo_dir, *CORRELATED, "trainer.correlation_steps=2"))
    result = correlation.log_correlation(client, run.info.run_id, cfg)
    metrics = client.get_run(run.info.run_id).data.metrics
    assert metrics[correlation.SEQUENTIAL] == pytest.approx(result["sequential"])
    assert metrics[correlation.SHUFFLED] == pytest.approx(result["shuffled"])
    assert correlation.SEQUENTIAL_RAW in metrics and correlation.SHUFFLED_RAW in metrics
