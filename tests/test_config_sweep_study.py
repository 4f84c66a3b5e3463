"""The keys of issue 68 (raystream/config/sweep_study.py): each bad input fails composing, before Ray starts,
naming the key; `raystream sweep` exits 2 on them (in this process: it would fail if Ray started)."""

from __future__ import annotations

import pytest
from cli_driver import in_process

from raystream.config import ConfigError, compose

COMPARED = ["sweep=smoke", "sweep.grid.trainer.seed=[0,1,2,3]", "sweep.compare.axis=optimizer.name",
            "sweep.compare.baseline=adamw"]


@pytest.mark.parametrize("overrides, key, expected", [
    (["sweep.compare.axis=optimizer.lr"], "sweep.compare.axis", "a grid axis (optimizer.name, stream.order)"),
    ([*COMPARED[:3], "sweep.compare.baseline=sgd"], "sweep.compare.baseline", "one of grid.optimizer.name's"),
    ([*COMPARED, "sweep.seeds.min=3", "sweep.seeds.max=2"], "sweep.seeds.min", "at most seeds.max (2)"),
    ([*COMPARED, "sweep.seeds.min=2", "sweep.seeds.max=5"], "sweep.seeds.max", "at most the 4 values of the seed"),
    ([*COMPARED, "sweep.seeds.min=1", "sweep.seeds.max=3"], "sweep.seeds.min", "an integer >= 2"),
    (["sweep=smoke", "sweep.seeds.min=2", "sweep.seeds.max=3"], "sweep.seeds", "a comparison too"),
    (["sweep.budget=0"], "sweep.budget", "null or a number > 0"),
    (["sweep.budget_cost=10"], "sweep.gpu_hour_price", "the price of one GPU-hour"),
    ([*COMPARED, "sweep.compare.alpha=1.5"], "sweep.compare.alpha", "a number between 0 and 1"),
    ([*COMPARED, "sweep.scheduler=asha"], "sweep.compare.axis", "scheduler null"),
])
def test_a_bad_input_names_its_key(overrides, key, expected):
    with pytest.raises(ConfigError) as exc:
        compose(overrides)
    assert f"config key `{key}`" in str(exc.value) and expected in str(exc.value)


def test_the_defaults_change_nothing_and_a_good_study_composes():
    sweep = compose(["sweep=smoke"]).sweep
    assert (sweep.budget, sweep.compare.axis, sweep.seeds.min) == (None, None, None)
    compose([*COMPARED, "sweep.seeds.min=2", "sweep.seeds.max=4", "sweep.budget=3", "sweep.compare.margin=0.01"])


def test_the_sweep_command_exits_2_before_ray(tmp_path, monkeypatch, capfd):
    with in_process(tmp_path, monkeypatch, capfd) as run:
        out = run("sweep", *COMPARED, "sweep.seeds.min=3", "sweep.seeds.max=2")
    assert out.returncode == 2 and "config key `sweep.seeds.min` = 3" in out.stderr
