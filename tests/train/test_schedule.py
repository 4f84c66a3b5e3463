"""Warm-up + cosine learning-rate schedule; DINO's cosine weight-decay schedule."""

import math

import pytest
import torch

from raystream.optim import build_optimizer, param_groups
from raystream.optim.factory import OptimizerConfig
from raystream import schedule
from raystream.schedule import (CosineWeightDecay, Schedules, WarmupCosine, build_weight_decay_schedule,
                                probe_lr_schedule, set_weight_decay)
from raystream.tracking import names


def test_the_schedule_keys_are_the_metric_names_a_run_logs():
    """schedule.py names its keys itself (it imports nothing above it); they are the metrics tracking records."""
    assert (schedule.LR, schedule.WD) == (names.LR, names.WD)


def test_warmup_is_linear_and_first_step_moves():
    f = WarmupCosine(total_steps=100, warmup_steps=10, min_lr_ratio=0.01)
    assert [f(t) for t in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(9) == pytest.approx(1.0)


def test_cosine_decays_to_min_ratio_at_last_step():
    f = WarmupCosine(total_steps=100, warmup_steps=10, min_lr_ratio=0.01)
    assert f(10) == pytest.approx(1.0)
    mid = 10 + (99 - 10) / 2
    assert f(int(mid)) == pytest.approx(0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 10) / 89)))
    assert f(99) == pytest.approx(0.01)
    values = [f(t) for t in range(10, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_warmup_longer_than_run_is_capped():
    f = WarmupCosine(total_steps=4, warmup_steps=10, min_lr_ratio=0.0)
    assert [f(t) for t in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_no_warmup_and_single_step():
    assert WarmupCosine(5, 0, 0.1)(0) == pytest.approx(1.0)
    assert WarmupCosine(1, 0, 0.1)(0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="total_steps"):
        WarmupCosine(0, 0, 0.1)


def test_schedules_are_pure_functions_of_the_step_and_match_torch_lambda_lr():
    """`Schedules.apply(opt, t)` gives what torch's LambdaLR gives after t steps, from any starting step: a run
    restored at step 7 needs no scheduler state."""
    cfg = OptimizerConfig(lr=0.5, warmup_steps=3, min_lr_ratio=0.1, weight_decay=0.04, weight_decay_end=0.4)

    def make():
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
        return build_optimizer(param_groups(model, cfg), cfg)

    reference = make()
    sched = torch.optim.lr_scheduler.LambdaLR(reference, WarmupCosine(20, 3, 0.1))
    expected = []
    for _ in range(20):
        expected.append(reference.param_groups[0]["lr"])
        reference.step(), sched.step()
    schedules = Schedules(cfg, total_steps=20)
    fresh, restored = make(), make()
    got = [schedules.apply(fresh, t)["lr"] for t in range(20)]
    assert got == expected  # bit for bit
    assert schedules.apply(restored, 7) == {"lr": expected[7], "wd": CosineWeightDecay(20, 0.04, 0.4)(7)}
    assert [g["lr"] for g in restored.param_groups] == [expected[7]] * 2
    wd = CosineWeightDecay(20, 0.04, 0.4)(7)
    assert [g["weight_decay"] for g in restored.param_groups] == [pytest.approx(wd), 0.0]
    assert "wd" not in Schedules(OptimizerConfig(), 20).apply(make(), 3)


def test_weight_decay_schedule_endpoints_and_monotonicity():
    f = CosineWeightDecay(total_steps=50, start=0.04, end=0.4)
    assert f(0) == pytest.approx(0.04) and f(49) == pytest.approx(0.4)
    assert f(24.5) == pytest.approx(0.22)  # half way: the mean of the ends
    values = [f(t) for t in range(50)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert f(60) == pytest.approx(0.4)  # past the end it stays there
    down = [CosineWeightDecay(10, 0.4, 0.0)(t) for t in range(10)]
    assert down[0] == pytest.approx(0.4) and down[-1] == pytest.approx(0.0)
    assert all(a > b for a, b in zip(down, down[1:]))
    assert CosineWeightDecay(1, 0.04, 0.4)(0) == pytest.approx(0.04)
    with pytest.raises(ValueError, match="total_steps"):
        CosineWeightDecay(0, 0.04, 0.4)


def test_weight_decay_schedule_only_when_an_end_is_set():
    assert build_weight_decay_schedule(OptimizerConfig(weight_decay=0.04), 10) is None
    f = build_weight_decay_schedule(OptimizerConfig(weight_decay=0.04, weight_decay_end=0.4), 10)
    assert (f(0), f(9)) == pytest.approx((0.04, 0.4))


def test_set_weight_decay_moves_the_decayed_group_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    cfg = OptimizerConfig(weight_decay=0.04, weight_decay_end=0.4)
    opt = build_optimizer(param_groups(model, cfg), cfg)
    set_weight_decay(opt, 0.3)
    assert [(g["decay"], g["weight_decay"]) for g in opt.param_groups] == [(True, 0.3), (False, 0.0)]


def test_the_probes_schedule_decays_to_zero_one_step_after_the_last_and_does_not_cap_its_warmup():
    """The probes' LambdaLR (eval/linear.py, eval/attentive.py) keeps its numbers now that it shares the formula with
    training: cosine over total - warmup steps to 0, a warm-up longer than the run not capped."""
    def lrs(warmup, total):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched, out = probe_lr_schedule(opt, warmup, total), []
        for _ in range(total):
            out.append(opt.param_groups[0]["lr"])
            opt.step(), sched.step()
        return out

    assert lrs(2, 6) == pytest.approx([0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5,
                                       0.5 * (1 + math.cos(3 * math.pi / 4))])
    assert lrs(8, 4) == pytest.approx([0.125, 0.25, 0.375, 0.5])
    assert lrs(0, 1) == [1.0]
