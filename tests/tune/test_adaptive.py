"""Seeds until the answer is known (raystream/tune/adaptive.py): rounds only for open comparisons, an interval that
stays valid when seeds are added after looking (simulated on a null, without Ray), a resume mid-round that suggests no
cell twice, reused cells not run, and a real Tune run driven by the searcher."""

from __future__ import annotations


import numpy as np
import pytest
from ray import tune

from raystream.tune.adaptive import (DIFFERENT, EQUIVALENT, OPEN, Comparison, SeedSearcher, interval, summary_lines,
                                     verdict)
from raystream.tune.searcher import CELL_KEY

SEED = "trainer.seed"


def _cells(arms, seeds, lrs=(None,)):
    """Grid cells in the plan's order (seed outermost), as space.plan gives their values."""
    return [{SEED: s, "optimizer": a, **({"optimizer.lr": lr} if lr is not None else {})}
            for s in range(seeds) for a in arms for lr in lrs]


def _comparison(lo=2, hi=5, margin=0.0, alpha=0.05):
    return Comparison(axis="optimizer", baseline="adamw", metric="loss", mode="min", seed_key=SEED, min_seeds=lo,
                      max_seeds=hi, margin=margin, alpha=alpha)


def _drive(searcher, value, limit=1000):
    """Run the search to its end, one trial at a time; `value(cell values)` is a trial's loss. Returns the cells run."""
    ran = []
    for i in range(limit):
        config = searcher.suggest(f"t{i}")
        if config == searcher.FINISHED:
            return ran
        assert config is not None  # one at a time: nothing runs when it is asked
        ran.append(config[CELL_KEY])
        searcher.on_trial_complete(f"t{i}", {"loss": value({k: v for k, v in config.items() if k != CELL_KEY})})
    raise AssertionError("the search did not end")


def test_interval_and_verdict():
    mean, half = interval([1.0, 3.0], 0.05)
    assert mean == 2.0 and half == pytest.approx(12.706 * 2 ** 0.5 / 2 ** 0.5, rel=1e-3)
    assert verdict(2.0, 1.0, 0.0) == DIFFERENT and verdict(0.1, 0.5, 0.0) == OPEN
    assert verdict(0.1, 0.2, 0.5) == EQUIVALENT and verdict(0.1, 0.5, 0.5) == OPEN
    assert interval([1.0], 0.05)[1] == float("inf")


def test_seeds_go_only_to_open_comparisons():
    """`big` differs from adamw clearly after the first round; `same` stays open to max; adamw follows `same`."""
    noise = {0: 0.0, 1: 0.3, 2: -0.2, 3: 0.5, 4: -0.4}
    effect = {"adamw": 0.0, "big": -50.0, "same": 0.0}
    jitter = {("same", 0): 0.2, ("same", 1): -0.3, ("same", 2): 0.25, ("same", 3): -0.1, ("same", 4): 0.05}

    def loss(values):
        a, s = values["optimizer"], values[SEED]
        return 10 + effect[a] + noise[s] + jitter.get((a, s), 0.0)

    cells = _cells(["adamw", "big", "same"], 5)
    searcher = SeedSearcher(cells, _comparison(2, 5))
    ran = [(cells[c]["optimizer"], cells[c][SEED]) for c in _drive(searcher, loss)]
    assert sorted(s for a, s in ran if a == "big") == [0, 1]
    assert sorted(s for a, s in ran if a == "same") == sorted(s for a, s in ran if a == "adamw") == [0, 1, 2, 3, 4]
    rows = {r["value"]: r for r in searcher.summary()}
    assert rows["big"]["status"] == DIFFERENT and rows["big"]["better"] == "value"
    assert rows["big"]["difference"] == pytest.approx(-50.0) and rows["big"]["saved"] == 3
    assert rows["same"]["status"] == OPEN and rows["same"]["seeds"] == 5
    assert searcher.trials_saved() == 3
    assert any(line.startswith("big vs adamw [all]: resolved (different), loss difference -50 ±")
               for line in summary_lines(searcher.summary()))


def test_groups_advance_on_their_own_and_a_group_without_baseline_runs_every_seed():
    cells = [c for c in _cells(["adamw", "b"], 4, lrs=(0.1, 0.2)) if not (c["optimizer"] == "adamw" and
                                                                           c["optimizer.lr"] == 0.2)]
    searcher = SeedSearcher(cells, _comparison(2, 4))
    ran = [cells[c] for c in _drive(searcher, lambda v: 1.0 + v[SEED] * (0.1 if v["optimizer"] == "b" else -0.1))]
    no_base = sorted(v[SEED] for v in ran if v["optimizer.lr"] == 0.2)
    assert no_base == [0, 1, 2, 3]  # nothing to compare with: every seed


def test_equivalent_within_the_margin_stops():
    cells = _cells(["adamw", "b"], 6)
    searcher = SeedSearcher(cells, _comparison(2, 6, margin=1.0))
    jitter = [0.02, -0.03, 0.01, 0.04, -0.02, 0.0]
    ran = _drive(searcher, lambda v: 5.0 + 0.001 * v[SEED] + (jitter[v[SEED]] if v["optimizer"] == "b" else 0.0))
    (row,) = searcher.summary()  # 2 seeds: too wide (t at alpha / 5 with one degree of freedom); 3: inside +-1
    assert (len(ran), row["status"], row["seeds"], row["saved"]) == (6, EQUIVALENT, 3, 3)


def test_reused_cells_are_not_run_and_count():
    cells = _cells(["adamw", "b"], 3)
    known = {i: 1.0 + i for i in range(4)}  # both arms' first two seeds finished before
    searcher = SeedSearcher(cells, _comparison(2, 3), known=known)
    ran = _drive(searcher, lambda v: 1.0)
    assert all(c not in known for c in ran)


def test_a_resume_mid_round_suggests_no_cell_twice(tmp_path):
    cells = _cells(["adamw", "b", "c"], 6)
    rng = np.random.default_rng(0)
    values = {i: float(rng.normal()) for i in range(len(cells))}
    first = SeedSearcher(cells, _comparison(2, 6))
    made = [first.suggest(f"t{i}") for i in range(4)]  # 4 of the 6 first-round cells started
    for i in range(2):
        first.on_trial_complete(f"t{i}", {"loss": values[made[i][CELL_KEY]]})
    first.save(str(tmp_path / "s.pkl"))  # the sweep is interrupted here: t2, t3 still running
    resumed = SeedSearcher(cells, _comparison(2, 6))
    resumed.restore(str(tmp_path / "s.pkl"))
    for i in (2, 3):  # Tune resumes the unfinished trials; they report to the restored searcher
        resumed.on_trial_complete(f"t{i}", {"loss": values[made[i][CELL_KEY]]})
    rest = _drive(resumed, lambda v: values[cells.index(v)])
    every = [m[CELL_KEY] for m in made] + rest
    assert len(every) == len(set(every))


def _null_study(rng, comparison, look_alpha=None):
    """One study on a null (both cells from one distribution): whether some look declared a difference."""
    a, b = rng.normal(size=comparison.max_seeds), rng.normal(size=comparison.max_seeds)
    if look_alpha is None:  # the searcher's own rounds and intervals
        cells = _cells(["adamw", "b"], comparison.max_seeds)
        searcher = SeedSearcher(cells, comparison)
        _drive(searcher, lambda v: float((a if v["optimizer"] == "adamw" else b)[v[SEED]]))
        return searcher.summary()[0]["status"] == DIFFERENT
    for n in range(comparison.min_seeds, comparison.max_seeds + 1):  # the same looks with a plain interval
        if verdict(*interval(list(b[:n] - a[:n]), look_alpha), 0.0) == DIFFERENT:
            return True
    return False


def test_on_a_null_a_difference_is_declared_in_at_most_alpha_of_studies():
    """4,000 simulated studies of two cells drawn from one distribution, seeds 2..8 added while open: the searcher
    declares a difference in at most alpha (0.05) of them; the same looks at a plain 95% interval would in far more,
    which is what the split of alpha over the rounds is for."""
    rng = np.random.default_rng(68)
    comparison = _comparison(2, 8, alpha=0.05)
    studies = 4000
    declared = sum(_null_study(rng, comparison) for _ in range(studies)) / studies
    naive = sum(_null_study(rng, comparison, look_alpha=0.05) for _ in range(studies)) / studies
    assert declared <= 0.05, declared
    assert naive > 0.08, naive


def _trainable(config):
    effect = {"adamw": 0.0, "big": -50.0, "same": 0.0}[config["optimizer"]]
    return {"loss": 10.0 + effect + 0.1 * ((config[SEED] * 7) % 5) + (0.2 if config[SEED] % 2 else -0.15) *
            (config["optimizer"] == "same")}


def test_a_tune_run_adds_seeds_where_open(ray_by_value, tmp_path):
    """The searcher drives Tune's own loop (suggest, results, its end). A trial's actor is kept for the next trial
    when one is waiting (6 processes for the 10 trials here, not 10: each is a Python process that imports Ray
    Tune); which process runs a trial is no part of the searcher's contract."""
    cells = _cells(["adamw", "big", "same"], 4)
    searcher = SeedSearcher(cells, _comparison(2, 4))
    tuner = tune.Tuner(tune.with_resources(_trainable, {"CPU": 0.5}),
                       tune_config=tune.TuneConfig(metric="loss", mode="min", search_alg=searcher,
                                                   num_samples=len(cells), max_concurrent_trials=3,
                                                   reuse_actors=True),
                       run_config=tune.RunConfig(verbose=0, storage_path=str(tmp_path)))
    results = tuner.fit()
    ran = sorted((r.config["optimizer"], r.config[SEED]) for r in results)
    assert [s for a, s in ran if a == "big"] == [0, 1]
    assert [s for a, s in ran if a == "same"] == [s for a, s in ran if a == "adamw"] == [0, 1, 2, 3]
    assert len(ran) == 10 and searcher.trials_saved() == 2
