"""Issue 68 through `run_sweep` on a real local Ray cluster and a real MLflow store: a sweep with a comparison, a
seed range and a budget stops adding seeds when the comparison is resolved, recording its spend; a sweep extended
by a seed then runs only the new trials (the ones that comparison ran reused and linked under the new parent run).
The comparison's sweep runs once for the module (`compared`), and both tests read it: each trial is a Tune trial
process of its own (a few CPU-seconds of imports), so one sweep less and two trials less than a first sweep of each
test's own. Trials are tune_tiny_fit.finish_at_once (a FINISHED child run with its params and a loss, no Train run),
so the sweep's own logic is what takes the time."""

from __future__ import annotations

import contextlib
import io
import shutil

import pytest
import ray.cloudpickle
from mlflow import MlflowClient

import tune_tiny_fit
from raystream.cli import sweep_summary
from raystream.config import compose, config_dir
from raystream.tune.identity import REUSED_FROM_TAG
from raystream.tune.sweep import run_sweep

pytestmark = pytest.mark.slow

SWEEP = """name: tiny_study
grid:
  optimizer.name: [adamw, orthogonal_adamw]
  trainer.seed: [0]
fixed:
  trainer.max_steps: 2
metric: loss
mode: min
"""


COMPARED = ["sweep=tiny_study", "sweep.grid.trainer.seed=[0,1,2,3]", "sweep.compare.axis=optimizer.name",
            "sweep.compare.baseline=adamw", "sweep.compare.margin=0.1", "sweep.seeds.min=2", "sweep.seeds.max=4",
            "sweep.budget=1.0"]


@pytest.fixture(scope="module")
def local_ray(ray_cluster):
    ray.cloudpickle.register_pickle_by_value(tune_tiny_fit)
    yield
    ray.cloudpickle.unregister_pickle_by_value(tune_tiny_fit)


@pytest.fixture(scope="module")
def compared(local_ray, tmp_path_factory):
    """The comparison's sweep (COMPARED), run once in a directory, config tree and MLflow store of the module's own
    (kept in the environment while the module's tests run): {"outcome", "out", "err" (what it printed), "uri"}."""
    root = tmp_path_factory.mktemp("study")
    shutil.copytree(config_dir(), root / "sweeps")
    (root / "sweeps" / "sweep" / "tiny_study.yaml").write_text(SWEEP)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAYSTREAM_CONFIG_DIR", str(root / "sweeps"))
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        patch.chdir(root)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            outcome = run_sweep(compose(COMPARED), COMPARED, fit=tune_tiny_fit.finish_at_once)
        yield {"outcome": outcome, "out": out.getvalue(), "err": err.getvalue(), "uri": uri}


def _children(uri, parent):
    client = MlflowClient(uri)
    experiment = client.get_run(parent).info.experiment_id
    return client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")


def test_a_resolved_comparison_stops_adding_seeds_within_the_budget(compared):
    """Both arms' losses are equal (finish_at_once logs 1.0): inside the margin after the first round of 2 seeds,
    so 4 of the grid's 8 trials run; the budget (no rate here) is kept against the measured trials."""
    outcome = compared["outcome"]
    assert sorted(t.config["trainer.seed"] for t in outcome.trials) == [0, 0, 1, 1]
    err = compared["err"] + compared["out"]
    assert "sweep.budget: the plan knows no rate for this setting" in compared["err"]
    assert "orthogonal_adamw vs adamw [all]: resolved (equivalent), loss difference +0 ± 0, 2 seeds, 2 trials saved" \
        in err
    assert "seed rounds: 4 trials of the full grid not run" in err
    parent = MlflowClient(compared["uri"]).get_run(outcome.parent_run_id)
    assert parent.data.metrics["study/budget_hours"] == 1.0 and 0 < parent.data.metrics["study/spent_hours"] < 1.0


def test_a_sweep_extended_by_a_seed_runs_only_the_new_trials(compared, capsys):
    """The comparison's sweep ran seeds 0 and 1 of both arms; the plain sweep of seeds 0-2 runs only seed 2."""
    first, uri = compared["outcome"], compared["uri"]
    more = ["sweep=tiny_study", "sweep.grid.trainer.seed=[0,1,2]"]
    second = run_sweep(compose(more), more, fit=tune_tiny_fit.finish_at_once)
    assert second.run_name != first.run_name  # another sweep: its name hashes its trials
    assert sorted(t.config["trainer.seed"] for t in second.trials) == [2, 2]  # only the new cells ran
    children = _children(uri, second.parent_run_id)
    links = [r for r in children if REUSED_FROM_TAG in r.data.tags]
    assert len(children) == 6 and len(links) == 4
    ran_first = {r.info.run_id for r in _children(uri, first.parent_run_id)}
    assert len(ran_first) == 4 and {r.data.tags[REUSED_FROM_TAG] for r in links} == ran_first
    assert all(r.data.metrics["loss"] == 1.0 and r.data.params["trainer.seed"] in ("0", "1") for r in links)
    said = capsys.readouterr()
    assert "4 of 6 trials reused (finished before, same config), not run again" in said.out  # the summary
    assert "4 of 6 trials finished before with the same config: reused" in said.err  # before the trials run
    # the second sweep again under another name: every trial reused, none run, and that is a success (exit 0)
    again = [*more, "sweep.run_name=tiny_again"]
    third = run_sweep(compose(again), again, fit=tune_tiny_fit.finish_at_once)
    assert (third.trials, third.reused, third.status) == ([], 6, "FINISHED")
    assert sweep_summary(third) == 0
    said = capsys.readouterr().out
    assert "sweep tiny_again: 0 trials finished (6 more reused: finished before), 0 failed" in said
    assert "Compare the 6 trials in the MLflow UI" in said
