"""`raystream plan train|sweep <overrides>` (raystream/tune/plan.py, its text plan_text.py): steps, trials, concurrent trials, wall time,
GPU-hours and cost of a command line before it is submitted, by the CLI in this process (`in_process`: it also
fails a command that starts Ray). The steps are checked against the run's own count (`preflight.total_steps`), the
trials against the sweep's plan (`space.plan`), the time and cost against the shipped H200 figures by arithmetic.
tests/tune/test_plan_sweep.py checks a plan against a small sweep actually run here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_driver import in_process

from raystream.config import compose
from raystream.train.preflight import total_steps
from raystream.tune.plan import layout
from raystream.tune.space import plan as sweep_plan

ROOT = Path(__file__).resolve().parents[2]

# VideoMAE's paper preset on two short demo walking tours (its own videos are not here): 2 x 600 frames hold 132
# clips of 16 frames at 12 fps, one global batch of 128 per pass, so the stream (10,000 passes) decides the steps
# before trainer.max_steps (260,000) does; 2 workers of 64 clips each, the H200 campaign's per-GPU batch.
VIDEOMAE = ["+experiment=videomae_paper", "data=walking_tour", "data.videos=null", "data.heldout_videos=null",
            "eval.dataset=null", "data.demo.num_videos=2", "data.demo.frames_per_video=600", "data.demo.canvas=32",
            "trainer.num_workers=2", "stream.batch_size=128"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Where the demo videos of this module's plans are generated (once: every plan of a config reuses them)."""
    return tmp_path_factory.mktemp("plan_demo")


@pytest.fixture
def run(tmp_path, monkeypatch, capfd):
    with in_process(tmp_path, monkeypatch, capfd) as run_:
        yield run_


def _plan(run, *args):
    out = run("plan", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_paper_preset_at_the_shipped_h200_rate(run, demo):
    overrides = [*VIDEOMAE, f"data.demo.cache_dir={demo}"]
    p = _plan(run, "train", *overrides, "--gpus", "8", "--gpu-hour-price", "3.5")
    (cell,) = p["cells"]
    assert p["trials"] == 1 and cell["steps"] == total_steps(compose(overrides)) == 10000
    assert cell["limited_by"] == "the stream"
    rate = p["rate"]  # named with its source, device and date
    assert (rate["device_name"], rate["date"], rate["memory_steps_per_s"], rate["live_steps_per_s"]) == \
        ("NVIDIA H200", "2026-11-27", 10.9, 7.46)
    assert "6a55e9c" in rate["source"] and "docs/benchmarks.md" in rate["source"]
    # 64 clips per GPU, as measured: the measured rates as they are; 2 GPUs per trial, 4 trials' worth of GPUs
    assert cell["steps_per_s"]["memory"] == pytest.approx(10.9) and cell["steps_per_s"]["live"] == pytest.approx(7.46)
    assert cell["trial_s"]["estimate"] == pytest.approx(10000 / 7.46)
    assert cell["trial_s"]["low"] == pytest.approx(10000 / 10.9 / 1.25)
    assert cell["trial_s"]["high"] == pytest.approx(10000 / 7.46 * 1.25)
    assert p["concurrent_trials"] == 1 and p["wall_s"] == pytest.approx(cell["trial_s"])
    assert p["gpu_hours"]["estimate"] == pytest.approx(10000 / 7.46 * 2 / 3600)
    assert p["cost"]["estimate"] == pytest.approx(p["gpu_hours"]["estimate"] * 3.5)

    # the same on 4 GPUs of 128 clips: the step less its optimizer step twice as long
    text = run("plan", "train", *overrides, "trainer.num_workers=1", "--gpus", "8", "--gpu-hour-price", "3.5").stdout
    assert "NVIDIA H200, 2026-11-27" in text and "6a55e9c" in text and "scaled from 64 to 128 clips per worker" in text
    assert "cost at 3.5 per GPU-hour" in text and "wall time:" in text


def test_trials_wait_for_a_free_slot_in_order():
    assert layout([3, 1, 1, 1], 2) == 3 and layout([1, 1, 1, 1, 1], 2) == 3 and layout([2, 2], 1) == 4


def test_a_sweep_on_a_cluster_yaml_without_a_rate_prints_steps_and_trials(run, demo):
    overrides = ["sweep=paper_table", "trainer=gpu", "data.demo.num_videos=8", "data.demo.frames_per_video=60",
                 f"data.demo.cache_dir={demo}"]
    p = _plan(run, "sweep", *overrides, "--cluster", str(ROOT / "cluster" / "aws.yaml"))
    assert p["trials"] == sweep_plan(compose(overrides), overrides).num_trials == 54
    steps = {c["label"]: c["steps"] for c in p["cells"]}
    for order in ("batch_along_time", "batch_along_video", "shuffled"):
        cell = compose([*overrides, f"stream.order={order}"])
        assert {v for k, v in steps.items() if f"stream.order={order}" in k} == {total_steps(cell)}
    # aws.yaml: 8 worker nodes at most, of 1 GPU (8 of them) or 8 GPUs (1): 15 GPUs, one per trial
    assert p["resources"]["GPU"] == 15 and p["concurrent_trials"] == 15
    assert p["rate"] is None and p["wall_s"] is None and p["cost"] is None
    out = run("plan", "sweep", *overrides, "sweep.max_concurrent_trials=4", "--cluster",
              str(ROOT / "cluster" / "aws.yaml"))
    assert out.returncode == 0, out.stderr
    assert "4 trials at a time (sweep.max_concurrent_trials = 4)" in out.stdout
    assert "no measured rate for videomae tiny" in out.stdout and "--rate-from" in out.stdout
    assert "54 trials: 18 cells x 3 samples" in out.stdout


@pytest.mark.parametrize("case", ["no file", "not json", "a list", "eval bench", "price", "spread", "preset",
                                  "cluster", "too big"])
def test_bad_inputs_end_in_one_line_naming_them(run, demo, tmp_path, case):
    base = ["train", *VIDEOMAE, f"data.demo.cache_dir={demo}"]
    bench = tmp_path / "bench.json"
    args, named = {
        "no file": ([*base, "--rate-from", str(tmp_path / "none.json")], f"--rate-from {tmp_path / 'none.json'}: "
                                                                         "no such file"),
        "not json": ([*base, "--rate-from", str(bench)], f"--rate-from {bench}: not JSON"),
        "a list": ([*base, "--rate-from", str(bench)], "a JSON list"),
        "eval bench": ([*base, "--rate-from", str(bench)], "lacks scenario, backbone"),
        "price": ([*base, "--gpu-hour-price", "-1"], "--gpu-hour-price -1: expected a price >= 0"),
        "spread": ([*base, "--spread", "0.5"], "--spread 0.5: expected a factor >= 1"),
        "preset": (["sweep", "sweep=paper_table", "scenario=nope"], "nope"),
        "cluster": ([*base, "--cluster", str(ROOT / "cluster" / "kuberay" / "raycluster.yaml")],
                    "no `available_node_types`"),
        "too big": ([*base, "trainer.num_workers=8", "stream.batch_size=512", "--gpus", "4"],
                    "holds 8 GPUs (trainer.num_workers = 8) but --gpus 4 has 4"),
    }[case]
    bench.write_text({"not json": "{\"device\": ", "a list": "[1, 2]",
                      "eval bench": json.dumps({"device": "cpu", "vit_s_images_per_s": 1.0})}.get(case, ""))
    out = run("plan", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert named in out.stderr and "Traceback" not in out.stderr and out.stdout == ""


def test_plan_imports_no_ray(tmp_path, demo):
    """The plan of a train command in a fresh interpreter: Ray (and MLflow) never imported."""
    code = ("import sys; from raystream.cli import main; rc = main(sys.argv[1:]); "
            "print('RC', rc, 'ray' in sys.modules, 'mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "plan", "train", *VIDEOMAE, f"data.demo.cache_dir={demo}",
                          "--gpus", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.stdout.splitlines()[-1] == "RC 0 False False", out.stdout + out.stderr
