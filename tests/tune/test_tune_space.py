"""A sweep file's grid and Optuna axes become the right trials: cells, precedence of fixed / grid / command line,
the grid x Optuna searcher (exact count per cell, sampled values in range, state survives save/restore), and how
many trials run at once."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from raystream.config import ConfigError, compose
from raystream.tune.searcher import CELL_KEY, GridOptunaSearcher
from raystream.tune.space import optuna_space, plan
from raystream.tune.concurrency import concurrent_trials

SWEEP = """name: t
grid:
  optimizer: [adamw, orthogonal_adamw]
  stream.order: [batch_along_time, batch_along_video, shuffled]
sample:
  optimizer.lr: loguniform(1e-5, 1e-3)
  optimizer.projection: choice(['global', 'per_tensor'])
fixed:
  trainer.max_steps: 7
  stream.batch_size: 4
num_samples: 4
"""


def test_group_axis_composes_each_group_file_and_fixed_applies(sweeps_dir):
    sweeps_dir("t", SWEEP)
    p = plan(compose(["sweep=t"]), ["sweep=t"])
    assert p.num_trials == 2 * 3 * 4
    assert [c.values["optimizer"] for c in p.cells] == ["adamw"] * 3 + ["orthogonal_adamw"] * 3
    for c in p.cells:
        assert c.config["optimizer"]["name"] == c.values["optimizer"]  # sweeps/optimizer/<v>.yaml was composed
        assert c.config["stream"]["order"] == c.values["stream.order"]
        assert c.config["trainer"]["max_steps"] == 7 and c.config["stream"]["batch_size"] == 4


def test_command_line_wins_over_fixed_and_collapses_a_grid_axis(sweeps_dir):
    sweeps_dir("t", SWEEP)
    overrides = ["sweep=t", "trainer.max_steps=3", "stream.order=shuffled", "optimizer.lr=0.01"]
    p = plan(compose(overrides), overrides)
    assert [c.values for c in p.cells] == [{"optimizer": "adamw"}, {"optimizer": "orthogonal_adamw"}]
    assert p.collapsed == {"stream.order": "shuffled"}
    assert "optimizer.lr" not in p.sample  # given on the command line: not searched
    for c in p.cells:
        assert c.config["trainer"]["max_steps"] == 3
        assert c.config["stream"]["order"] == "shuffled"
        assert c.config["optimizer"]["lr"] == 0.01


def test_exclude_leaves_out_matching_cells_and_a_bad_entry_is_named(sweeps_dir):
    """Table 1's shape: shuffled runs of one optimizer only, not the whole product of optimizer x order."""
    sweeps_dir("t", SWEEP + "exclude:\n  - {optimizer: orthogonal_adamw, stream.order: shuffled}\n"
                            "  - {optimizer: orthogonal_adamw, stream.order: batch_along_video}\n")
    p = plan(compose(["sweep=t"]), ["sweep=t"])
    assert [(c.values["optimizer"], c.values["stream.order"]) for c in p.cells] == [
        ("adamw", "batch_along_time"), ("adamw", "batch_along_video"), ("adamw", "shuffled"),
        ("orthogonal_adamw", "batch_along_time")]
    assert [c.index for c in p.cells] == [0, 1, 2, 3] and p.num_trials == 4 * 4
    overrides = ["sweep=t", "stream.order=shuffled"]  # a collapsed axis still matches its entries
    assert [c.values for c in plan(compose(overrides), overrides).cells] == [{"optimizer": "adamw"}]
    overrides = ["sweep=t", "stream.order=shuffled", "optimizer=orthogonal_adamw"]
    with pytest.raises(ConfigError, match=r"sweep.exclude` leaves out every grid cell"):
        plan(compose(overrides), overrides)
    for entry, named in [("{optimizer: sgd}", r"sweep.exclude\[0\].optimizer` = 'sgd': expected one of the axis"),
                         ("{trainer.seed: 1}", r"sweep.exclude\[0\].trainer.seed` = 1: expected a grid axis"),
                         ("[]", r"sweep.exclude\[0\]` = .*expected a mapping")]:
        sweeps_dir("t", SWEEP + f"exclude:\n  - {entry}\n")
        with pytest.raises(ConfigError, match=named):
            compose(["sweep=t"])


def test_fingerprint_follows_what_the_trials_run(sweeps_dir):
    sweeps_dir("t", SWEEP)
    a = plan(compose(["sweep=t"]), ["sweep=t"]).fingerprint()
    assert a == plan(compose(["sweep=t"]), ["sweep=t"]).fingerprint()
    assert a != plan(compose(["sweep=t", "trainer.max_steps=5"]), ["sweep=t", "trainer.max_steps=5"]).fingerprint()
    assert a == plan(compose(["sweep=t", "sweep.max_concurrent_trials=1"]), []).fingerprint()


def _searcher(sweeps_dir, **kw):
    sweeps_dir("t", SWEEP)
    p = plan(compose(["sweep=t"]), ["sweep=t"])
    return p, GridOptunaSearcher([c.values for c in p.cells], optuna_space(p.sample), p.num_samples,
                                 metric="loss", mode="min", **kw)


def test_grid_x_optuna_gives_num_samples_trials_per_cell_in_range(sweeps_dir):
    p, s = _searcher(sweeps_dir)
    configs = []
    for i in range(p.num_trials):
        cfg = s.suggest(f"t{i}")
        configs.append(cfg)
        s.on_trial_complete(f"t{i}", {"loss": math.log10(cfg["optimizer.lr"]) ** 2})
    assert s.suggest("extra") == GridOptunaSearcher.FINISHED
    assert Counter(c[CELL_KEY] for c in configs) == {i: 4 for i in range(6)}
    assert [c[CELL_KEY] for c in configs[:6]] == list(range(6))  # round-robin over cells
    for c in configs:
        assert {k: v for k, v in c.items() if k in p.cells[0].values} == p.cells[c[CELL_KEY]].values
        assert 1e-5 <= c["optimizer.lr"] <= 1e-3
        assert c["optimizer.projection"] in ("global", "per_tensor")
    lrs = [c["optimizer.lr"] for c in configs]
    assert len(set(lrs)) == len(lrs)  # sampled, not repeated
    assert sum(lr < 1e-4 for lr in lrs) >= 4  # log-uniform: a real share below the geometric middle


def test_searcher_state_survives_save_and_restore(sweeps_dir, tmp_path):
    p, s = _searcher(sweeps_dir, seed=3)
    first = [s.suggest(f"t{i}") for i in range(5)]
    for i in range(5):
        s.on_trial_complete(f"t{i}", {"loss": float(i)})
    s.save(str(tmp_path / "searcher.pkl"))
    _, fresh = _searcher(sweeps_dir, seed=99)
    fresh.restore(str(tmp_path / "searcher.pkl"))
    rest = [fresh.suggest(f"t{i}") for i in range(5, p.num_trials)]
    assert fresh.suggest("extra") == GridOptunaSearcher.FINISHED
    assert Counter(c[CELL_KEY] for c in first + rest) == {i: 4 for i in range(6)}


def test_without_sample_axes_each_cell_runs_once():
    p = plan(compose([]))
    s = GridOptunaSearcher([c.values for c in p.cells], optuna_space(p.sample), p.num_samples, "loss", "min")
    configs = [s.suggest(str(i)) for i in range(4)]
    assert s.suggest("4") == GridOptunaSearcher.FINISHED
    assert [c[CELL_KEY] for c in configs] == [0, 1, 2, 3]
    assert configs[3] == {CELL_KEY: 3, "optimizer.name": "orthogonal_adamw", "stream.order": "shuffled"}


def test_concurrent_trials_from_cluster_resources_and_trial_needs():
    p = plan(compose([]))
    assert concurrent_trials(p, {"CPU": 2.0}) == 2
    assert concurrent_trials(p, {"CPU": 16.0}) == 4  # never more than there are trials
    p2 = plan(compose(["trainer.num_workers=2"]), ["trainer.num_workers=2"])
    assert concurrent_trials(p2, {"CPU": 5.0}) == 2
    assert concurrent_trials(p2, {"CPU": 1.0}) == 1  # at least one (it waits for resources)
    p3 = plan(compose(["trainer.use_gpu=true"]), ["trainer.use_gpu=true"])
    assert concurrent_trials(p3, {"CPU": 32.0, "GPU": 3.0}) == 3
