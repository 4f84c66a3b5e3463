"""What a user sees of a sweep in the MLflow UI, on a real sqlite store (no Ray): trials named for what sets them
apart (short enough for the runs table), the parent's description listing the grid, and the saved view the
sweep's last line links to (its runs, grouped so every trial shows, the grid values and metrics as columns)."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from raystream.config import compose
from raystream.tracking import names, ui
from raystream.tracking.store import prepare_store, start_run
from raystream.tune.space import plan
from raystream.tune.sweep_run import parent_run
from raystream.tune.trial import record_failed_trial, trial_tags

UI_NAME_CHARS = 20  # the runs table shows about this many characters of a run name before cutting it


def _names(overrides):
    p = plan(compose(overrides), overrides)
    return [names.trial_run_name(c.values) for c in p.cells]


def test_trial_names_are_the_grid_values_short_and_distinct():
    smoke = _names([])
    assert smoke == ["adamw-time", "adamw-shuffled", "orth_adamw-time", "orth_adamw-shuffled"]
    assert max(map(len, smoke)) <= UI_NAME_CHARS
    regime = _names(["+experiment=regime", "sweep=regime"])
    assert len(set(regime)) == len(regime) == 24
    assert "orth_adamw_099-shuffled-s2" in regime  # seeds, the replicates, come last
    beta = _names(["sweep=beta"])
    assert beta[:2] == ["b0-s0", "b0-s1"] and "b0.99-s2" in beta
    table1 = _names(["+experiment=table1_mini", "sweep=table1_mini"])  # a path axis: its last part, not the path
    assert len(set(table1)) == len(table1) == 24
    assert "table1_start-adamw-time-s0" in table1 and "random-adamw-shuffled-s2" in table1


def test_sampled_values_join_the_name_and_a_collapsed_axis_leaves_it():
    assert names.trial_run_name({"optimizer.name": "adamw"}, {"optimizer.lr": 3.21e-4}) == "adamw-lr0.000321"
    assert _names(["stream.order=shuffled"]) == ["adamw", "orth_adamw"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'mlflow.db'}"
    prepare_store(uri)  # once: creating a store takes seconds
    return uri


def _sweep(uri, experiment, overrides=()):
    cfg = compose(list(overrides))
    p = plan(cfg, list(overrides))
    return uri, p, parent_run(uri, experiment, "smoke-x", cfg, p, None)


def test_trial_runs_are_named_by_their_grid_values_and_keep_their_train_run_name(store):
    uri, p, parent = _sweep(store, "names")
    client = MlflowClient(uri)
    info = {"name": "smoke", "run_name": "smoke-x", "cell_values": [c.values for c in p.cells]}
    shown = names.trial_run_name(p.cells[3].values)
    tags = {**trial_tags(info, 3, "t3", {}), names.RUN_NAME_TAG: shown}
    run = client.get_run(start_run(client, experiment="names", uri=uri, run_name="smoke-x-t3", parent_run_id=parent,
                                   tags=tags))
    assert run.info.run_name == "orth_adamw-shuffled"
    assert run.data.tags[names.TAG_RUN_NAME] == "smoke-x-t3"  # the Ray Train run, for resuming it
    try:
        raise RuntimeError("bad.mp4: not a video")
    except RuntimeError as exc:  # a trial that failed before its Train run existed is named the same way
        record_failed_trial(uri, parent, "smoke-x-t1",
                            {**trial_tags(info, 1, "t1", {}), names.RUN_NAME_TAG: "adamw-shuffled"}, exc)
    failed = client.search_runs([run.info.experiment_id], filter_string="attributes.status = 'FAILED'")
    assert [r.info.run_name for r in failed] == ["adamw-shuffled"]


def test_the_parent_description_lists_the_grid(store):
    uri, p, parent = _sweep(store, "description", ["sweep=paper_table"])
    note = MlflowClient(uri).get_run(parent).data.tags[names.NOTE_TAG]
    assert "- `stream.order`: batch_along_time, batch_along_video, shuffled" in note
    assert "- `optimizer.lr`: loguniform(1e-4, 3e-3)" in note and "54 trials" in note


def test_the_sweep_saves_a_view_of_its_runs_with_the_grid_as_columns(store):
    uri, p, parent = _sweep(store, "view", ["+experiment=regime", "sweep=regime"])
    client = MlflowClient(uri)
    exp = client.get_experiment(client.get_run(parent).info.experiment_id)
    view = json.loads(exp.tags[names.SHARED_VIEW_TAG_PREFIX + "smoke-x"])
    assert view["searchFilter"] == "tags.`raystream.sweep_run` = 'smoke-x'"
    # `optimizer` is a config group: its value is a tag of the trial, the other axes are params.
    assert view["selectedColumns"] == ["tags.`raystream.grid.optimizer`", "params.`stream.order`",
                                       "params.`trainer.seed`", "metrics.`loss`"]
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "raystream.role"}]
    assert client.search_runs([exp.experiment_id], filter_string=view["searchFilter"])[0].info.run_id == parent


def test_the_last_line_is_the_link_and_the_command_names_the_store_absolutely():
    local = ui.open_lines("sqlite:////data/x/mlflow.db", "7", "smoke-ab12", 4)
    assert local[-1] == "  http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=smoke-ab12"
    assert local[-2].endswith(" ui --backend-store-uri sqlite:////data/x/mlflow.db --host 127.0.0.1 --port 5000 --workers 1")
    server = ui.open_lines("https://mlflow.example.org/", "7", "smoke-ab12", 4)
    assert server[-1] == "  https://mlflow.example.org/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=smoke-ab12"
    assert not any(" ui " in line for line in server)


def test_a_store_refusing_the_view_costs_the_view_not_the_sweep(store, capsys):
    ui.write_view(MlflowClient(store), "999999", "smoke-x", ["metrics.`loss`"])  # no such experiment
    assert "could not save the MLflow UI view of smoke-x" in capsys.readouterr().err
