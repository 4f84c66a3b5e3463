"""The rates `raystream plan` times steps with (raystream/tune/rates.py): the shipped H200 figures, read from the
campaign file raystream/bench/h200_campaign.json, and the rate model that moves a rate to another batch and optimizer.
"""

from __future__ import annotations

import json

import pytest

from raystream.tune.rates import SHIPPED, Rate, load_bench, step_seconds


def test_the_shipped_rates_are_the_campaigns_third_run():
    """The figures docs/benchmarks.md reports for the third run (2026-11-27, commit 6a55e9c), per preset."""
    got = {r.scenario: (r.backbone, r.frames_per_clip, r.batch_per_worker, r.memory_steps_per_s, r.live_steps_per_s,
                        r.optimizer_step_ms["orthogonal_adamw"], r.order) for r in SHIPPED}
    assert got == {"future_prediction": ("large", 4, 16, 18.2, 18.8, 10.04, "batch_along_time"),
                   "dora": ("small", 8, 32, 2.50, 2.41, 2.02, "batch_along_time"),
                   "videomae": ("base", 16, 64, 10.9, 7.46, 3.72, "batch_along_time")}
    assert {(r.device, r.device_name, r.date, r.bf16, r.resolution) for r in SHIPPED} == \
        {("cuda", "NVIDIA H200", "2026-11-27", True, 224)}
    assert all("6a55e9c" in r.source and "docs/benchmarks.md" in r.source for r in SHIPPED)


def test_the_step_less_its_optimizer_step_scales_with_the_batch():
    videomae = next(r for r in SHIPPED if r.scenario == "videomae")
    seconds, note = step_seconds(videomae, 10.0, 128, "orthogonal_adamw")
    assert seconds == pytest.approx((0.1 - 0.00372) * 2 + 0.00372) and "scaled from 64 to 128" in note
    seconds, note = step_seconds(videomae, 10.0, 64, "adamw_foreach")
    assert seconds == pytest.approx(0.1 - 0.00372 + 0.00379) and "adamw_foreach's step 3.79 ms" in note
    bare = Rate("videomae", "tiny", 4, 32, "cpu", False, 8, 20.0, None, "orthogonal_adamw")
    assert step_seconds(bare, 20.0, 4, "adamw") == (pytest.approx(0.025), pytest.approx(
        "adamw's step not timed: orthogonal_adamw's rate used; scaled from 8 to 4 clips per worker"))


def test_a_bench_file_gives_its_rate_and_a_bad_one_is_named(tmp_path):
    bench = {"device": "cpu", "device_name": "cpu", "date": "2026-12-07 10:00 UTC", "scenario": "videomae",
             "backbone": "tiny", "frames_per_clip": 4, "resolution": 32, "bf16": False, "batch_size": 2,
             "optimizer": "orthogonal_adamw", "from_memory_steps_per_s": 4.0, "live_steps_per_s": 3.0,
             "optimizer_step_ms": {"orthogonal_adamw": 1.5}, "overrides": ["stream.order=shuffled"]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    rate = load_bench(str(path))
    assert (rate.memory_steps_per_s, rate.live_steps_per_s, rate.batch_per_worker, rate.order) == \
        (4.0, 3.0, 2, "shuffled")
    assert rate.source == f"raystream bench --json {path}"
    path.write_text(json.dumps({**bench, "batch_size": "two"}))
    with pytest.raises(ValueError, match=f"--rate-from {path}: a value of the wrong type"):
        load_bench(str(path))


def test_a_trial_outside_its_steps_is_the_benchs_parts_and_absent_without_them(tmp_path):
    """rates.py `outside_steps_s`: the chain of process starts, the build, the correlation, each evaluation and
    checkpoint, as raystream bench measured them (raystream/bench/trial_parts.py); an older bench file (or the shipped
    campaign) has none, and the plan then says so."""
    from raystream.tune.rates import outside_steps_s

    bench = {"device": "cpu", "scenario": "videomae", "backbone": "tiny", "frames_per_clip": 4, "resolution": 32,
             "batch_size": 2, "from_memory_steps_per_s": 4.0, "live_steps_per_s": 3.0, "trial_process_chain": 3,
             "trial_parts_s": {"process_start": 5.0, "build": 2.0, "correlation": 4.0, "evaluation": 1.5,
                               "checkpoint": 0.25}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    rate = load_bench(str(path))
    assert outside_steps_s(rate, evaluations=2, checkpoints=4) == pytest.approx(3 * 5.0 + 2.0 + 4.0 + 3.0 + 1.0)
    assert all(outside_steps_s(r, 1, 1) is None for r in SHIPPED)
