"""`raystream data correlation` and the run-start measurement in the workers (raystream/train/correlation.py) on real
demo videos decoded by decord, real torch gradients, real gloo process groups, a real Ray Train run and MLflow store.

The correlated stream: the moving-digits demo with consecutive clips one source frame apart, batches of 2 along
time and a VideoMAE mask fixed for the whole pass (`scenario.mask.mode=fixed`), so consecutive batches hold nearly
the same pixels under the same mask; shuffled batches are random clips of 2 videos.
"""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_driver import in_process
from raystream.config import ConfigError, compose
from raystream.data import build_stream
from raystream.data.demo.videos import ensure_demo_videos
from raystream.models import build_scenario
from raystream.tracking.store import client as make_client
from raystream.train import correlation


def _tiny(tmp, *extra):
    return ["data.demo.num_videos=2", "data.demo.frames_per_video=90", f"data.demo.cache_dir={tmp / 'demo'}",
            "stream.batch_size=2", "stream.clip_shift=1", "scenario.backbone.depth=1", *extra]


CORRELATED = ("scenario.mask.mode=fixed",)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "raystream.cli", "data", "correlation", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def cli_here(tmp_path, monkeypatch, capfd):
    """cli_here(*args): `raystream data correlation <args>` run in this process by the CLI's `main`
    (tests/cli_driver.py `in_process`), as a CompletedProcess. A fresh interpreter (torch's import) costs seconds of
    CPU per run; the command as a user runs it, in a process of its own, is `_cli`'s
    (test_cli_prints_one_json_line_with_both_orders)."""
    with in_process(tmp_path, monkeypatch, capfd) as run:
        yield lambda *args: run("data", "correlation", *args)


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


def test_the_forward_passes_run_under_the_runs_autocast(demo_dir):
    """`trainer.bf16=true` (the training step's bf16 autocast, here on the CPU) moves every figure off the fp32
    one's last bits, and by little: the same measurement in another precision."""
    torch.set_num_threads(1)
    fp32 = correlation.measure(compose(_tiny(demo_dir, *CORRELATED)), steps=2)
    bf16 = correlation.measure(compose(_tiny(demo_dir, *CORRELATED, "trainer.bf16=true")), steps=2)
    assert not fp32["bf16"] and bf16["bf16"]
    for key in ("sequential", "shuffled", "sequential_raw", "shuffled_raw"):
        assert bf16[key] != fp32[key] and bf16[key] == pytest.approx(fp32[key], abs=0.05), (key, fp32, bf16)


# In a fresh interpreter (the resident set is the measurement's, not a test session's), glibc giving freed memory back
# (so the resident set follows what is held): the peak RSS of the measurement at 1 and at 3 pairs per order, and the
# size of one flattened gradient.
_PEAKS = """
import json, sys, torch
from raystream.bench.memory import PeakMemory, rss
from raystream.config import compose
from raystream.data import build_stream
from raystream.models import build_scenario
from raystream.train.correlation import measure_model
torch.set_num_threads(1)
cfg = compose(sys.argv[1:])
model = build_scenario(cfg.scenario, cfg.stream, seed=0).model
base = build_stream(cfg.data, cfg.stream)
meter, peaks = PeakMemory(torch.device("cpu"), rss()), {}
for steps in (1, 3, 1):
    meter.start()
    measure_model(model, cfg, base, steps=steps)
    peaks[steps] = meter.stop()[1]
print(json.dumps({"peaks": peaks, "gradient": 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)}))
"""


def test_what_the_measurement_holds_does_not_grow_with_the_pairs(demo_dir):
    """Two passes (sum, then the pairs again): at most 3 gradients held, at 1 pair per order as at 3, where keeping
    every gradient would hold 8 more (12 against 4). A ViT-B block at 32 px: a gradient of about 40 MB."""
    overrides = _tiny(demo_dir, "scenario.backbone.preset=base")
    out = subprocess.run([sys.executable, "-c", _PEAKS, *overrides], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    peaks, gradient = {int(k): v for k, v in r["peaks"].items()}, r["gradient"]
    print("peak RSS above the start, MB:", {k: v / 1e6 for k, v in peaks.items()}, "gradient MB:", gradient / 1e6)
    assert gradient > 30e6
    assert peaks[3] - peaks[1] < gradient, peaks


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


def test_bad_checkpoint_path_exits_2_naming_it(demo_dir, tmp_path, cli_here):
    missing = tmp_path / "no-such-run"
    out = cli_here(*_tiny(demo_dir), "--steps", "1", "--checkpoint", str(missing))
    assert out.returncode == 2
    assert str(missing) in out.stderr and "no such file" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_stream_of_one_batch_exits_2(demo_dir, cli_here):
    out = cli_here(*_tiny(demo_dir, "stream.batch_size=100"), "--steps", "1")
    assert out.returncode == 2
    assert "consecutive batches need at least 2" in out.stderr and "Traceback" not in out.stderr


def test_zero_steps_exits_2(demo_dir, cli_here):
    out = cli_here(*_tiny(demo_dir), "--steps", "0")
    assert out.returncode == 2 and "--steps 0" in out.stderr


def test_bad_device_or_micro_batch_exits_2_naming_it(demo_dir, capfd, cli_here):
    out = cli_here(*_tiny(demo_dir), "--steps", "1", "--device", "tpu9", "--micro-batch", "1")
    assert out.returncode == 2 and "--device tpu9" in out.stderr and "Traceback" not in out.stderr
    cfg = compose(_tiny(demo_dir))
    assert correlation.main(cfg, steps=1, micro_batch=0) == 2
    assert "--micro-batch 0: expected at least 1 clip" in capfd.readouterr().err
    if not torch.cuda.is_available():
        assert correlation.main(cfg, steps=1, device="cuda") == 2
        assert "--device cuda: this machine has no CUDA GPU" in capfd.readouterr().err


def test_micro_places_cut_each_rank_shard():
    assert correlation.micro_places(8, 2, 1) == [range(4, 8)]
    assert correlation.micro_places(8, 2, 1, 3) == [range(4, 7), range(7, 8)]
    assert correlation.micro_places(8, 1, 0, 100) == [range(0, 8)]  # never more than the shard
    with pytest.raises(ValueError, match="micro-batch 0"):
        correlation.micro_places(8, 1, 0, 0)


def test_the_workers_micro_batch_is_the_training_batch_unless_set():
    assert correlation.per_worker_batch(compose(["stream.batch_size=8", "trainer.num_workers=2"])) == 4
    assert correlation.per_worker_batch(compose(["stream.batch_size=8", "trainer.num_workers=2",
                                                 "trainer.correlation_micro_batch=1"])) == 1
    with pytest.raises(ConfigError, match=r"trainer\.correlation_micro_batch` = 0"):
        compose(["trainer.correlation_micro_batch=0"])


# The regime preset (future prediction on the walking-tour demo, batch 4 along time), shrunk to a 300-frame video.
# PINNED: its figures from the driver-side implementation this measurement replaced (commit 934278f,
# `correlation.measure(cfg, steps=3)`, 1 torch thread): the move to the workers must not change them.
REGIME_STEPS = 3
PINNED = {"sequential": 0.9750550985336304, "shuffled": 0.14115043357014656,
          "sequential_raw": 0.9962745110193888, "shuffled_raw": 0.9629306793212891}
# The figures are cosines of float32 gradients, and their last bits depend on the order in which the sums run:
# oneDNN and ATen choose their vector kernels by the CPU's instruction set, and micro-batches and ranks add the
# batch's gradient up in other orders again. Two machines of CI's size gave figures 3.2e-6 apart. The centred figures
# divide by the norm of g - mean(g), here about a thirtieth of |g| (shuffled_raw is 0.963), which magnifies that
# rounding about thirtyfold. So figures are compared to TOL = 1e-4 absolute (on values in [-1, 1]): thirty times the
# spread seen between machines, and far below what a change of the computation moves them by: measuring another
# pair of steps moves `sequential` by 3.4e-3 and `shuffled` by 0.25 (see the test that tells them apart below).
TOL = 1e-4


@pytest.fixture(scope="module")
def regime(tmp_path_factory):
    demo = tmp_path_factory.mktemp("regime-demo")
    return ["+experiment=regime", "data.demo.frames_per_video=300", f"data.demo.cache_dir={demo}"]


def _figures(result):
    return {k: result[k] for k in PINNED}


def test_regime_figures_at_world_size_one_are_unchanged(regime):
    torch.set_num_threads(1)
    result = correlation.measure(compose(regime), steps=REGIME_STEPS)
    assert result["steps"] == [0, 30, 60] and result["micro_batch"] == 4
    assert _figures(result) == pytest.approx(PINNED, abs=TOL)


def test_the_tolerance_tells_another_computation_apart(regime):
    """TOL is loose enough for rounding and tight enough for a change: the same stream measured over another pair of
    steps (0 and 60 instead of 0, 30 and 60) moves a figure by more than ten times TOL."""
    torch.set_num_threads(1)
    result = correlation.measure(compose(regime), steps=REGIME_STEPS - 1)
    assert result["steps"] == [0, 60]
    assert max(abs(result[k] - PINNED[k]) for k in PINNED) > 10 * TOL, _figures(result)


def test_micro_batches_give_the_whole_batch_figures(regime):
    """Micro-batches of 3 clips (3 + 1 per batch of 4): memory of 3 clips, the same figures."""
    torch.set_num_threads(1)
    result = correlation.measure(compose(regime), steps=REGIME_STEPS, micro_batch=3)
    assert result["micro_batch"] == 3
    assert _figures(result) == pytest.approx(PINNED, abs=TOL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dora(demo_dir):
    return ["scenario=dora", "data=walking_tour", "stream=dora", "stream.batch_size=4",
            "data.demo.frames_per_video=300", f"data.demo.cache_dir={demo_dir / 'walking'}"]


@pytest.fixture(scope="module")
def two_gloo_ranks(regime, dora, tmp_path_factory):
    """{job: figures} of two processes in a gloo group (tests/train/correlation_ranks.py), each on its shard in
    micro-batches of 1: the regime preset and DoRA, measured one after the other by the same two processes."""
    jobs = {"regime": {"steps": REGIME_STEPS, "micro": 1, "overrides": regime},
            "dora": {"steps": 2, "micro": 1, "overrides": dora}}
    for job in jobs.values():  # written here, not by both ranks at once
        ensure_demo_videos(compose(job["overrides"]).data.demo)
    tmp = tmp_path_factory.mktemp("gloo")
    out, jobs_json = tmp / "figures.json", tmp / "jobs.json"
    jobs_json.write_text(json.dumps(jobs))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    script = str(Path(__file__).with_name("correlation_ranks.py"))
    ranks = [subprocess.Popen([sys.executable, script, str(out), str(jobs_json)],
                              env={**env, "RANK": str(r)}, stderr=subprocess.PIPE, text=True) for r in range(2)]
    errors = [p.communicate(timeout=300)[1] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], errors
    results = json.loads(out.read_text())
    for name, job in jobs.items():
        assert results[name]["world_size"] == 2 and results[name]["micro_batch"] == job["micro"], name
    return results


def test_two_gloo_ranks_give_the_single_process_figures(two_gloo_ranks):
    """Two processes in a gloo group, each with its shard of 2 clips in micro-batches of 1, sum their gradients."""
    result = two_gloo_ranks["regime"]
    assert result["steps"] == [0, 30, 60]
    assert _figures(result) == pytest.approx(PINNED, abs=TOL)


def test_two_gloo_ranks_on_dora(dora, two_gloo_ranks):
    """DoRA: augmentations by place, a centre buffer updated (and all-reduced) in every forward pass, restored."""
    single = correlation.measure(compose(dora), steps=2)
    result = two_gloo_ranks["dora"]
    assert result["steps"] == single["steps"]
    assert _figures(result) == pytest.approx(_figures(single), abs=TOL)


@pytest.mark.slow
def test_ray_train_workers_log_the_single_process_figures(ray_cluster, regime, tmp_path):
    """A Ray Train run of 2 workers measures before step 0, each worker on its shard; rank 0 logs the figures at
    step 0 of the run's MLflow run, equal to the single-process ones. The same run is future prediction's through
    Ray Train with 2 DDP workers (tests/train/test_fit_scenarios.py has the other scenarios): it trains and reports
    its in-stream and out-of-stream evaluations."""
    from raystream.train.run import fit

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose([*regime, "trainer.num_workers=2", "trainer.max_steps=1", f"trainer.correlation_steps={REGIME_STEPS}",
                   "eval.heldout_batches=1", f"trainer.storage_path={tmp_path / 'results'}",
                   f"mlflow.tracking_uri={uri}"])
    final = fit(cfg, run_name="workers")
    client = make_client(uri)
    logged = {key: client.get_metric_history(final["mlflow_run_id"], metric)
              for metric, key in correlation.METRICS.items()}
    assert {k: [m.step for m in h] for k, h in logged.items()} == {k: [0] for k in PINNED}
    assert {k: h[0].value for k, h in logged.items()} == pytest.approx(PINNED, abs=TOL)
    assert final["steps_done"] == 1 and math.isfinite(final["loss"])
    for key in ("eval/mse_in_stream", "eval/psnr_in_stream", "eval/mse_out_of_stream", "eval/psnr_out_of_stream"):
        assert key in final and math.isfinite(final[key]), (key, sorted(final))


def test_one_pair_per_order_takes_each_gradient_once_with_the_two_pass_figures(regime, monkeypatch):
    """One pair per order (trainer.correlation_steps=1, the CPU rehearsal's and `raystream bench`'s): the four
    gradients are taken once each (4 forward passes of the batch of 4, not the two passes' 8) and their Gram matrix
    gives the figures the two passes give, within TOL."""
    torch.set_num_threads(1)
    cfg = compose(regime)
    base = build_stream(cfg.data, cfg.stream)
    results, forwards = {}, {}
    try:
        for name, held in (("once", correlation.SINGLE_PASS_HELD), ("two passes", 0)):
            monkeypatch.setattr(correlation, "SINGLE_PASS_HELD", held)
            model = build_scenario(cfg.scenario, cfg.stream, seed=int(cfg.trainer.seed)).model
            calls = []
            model.register_forward_hook(lambda *_: calls.append(1))
            results[name] = correlation.measure_model(model, cfg, base, steps=1)
            forwards[name] = len(calls)
    finally:
        base.close()
    assert forwards == {"once": 4, "two passes": 8}
    assert _figures(results["once"]) == pytest.approx(_figures(results["two passes"]), abs=TOL)
    assert results["once"]["parameters"] == results["two passes"]["parameters"]
