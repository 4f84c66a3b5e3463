"""A trial's identity (raystream/tune/identity.py): bookkeeping left out, an absent (newer) key counted as its default,
and finished trials found and linked in a real MLflow store (sqlite in tmp)."""

from __future__ import annotations

import copy

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from raystream.config import compose, flatten
from raystream.tracking import names
from raystream.tune import identity
from raystream.tune.space import plan


def _config(*overrides):
    return OmegaConf.to_container(compose(list(overrides)), resolve=True)


def _store_trial(client, experiment_id, config, status="FINISHED", drop=(), parent=None, error=None):
    """A sweep trial's child run as raystream.train.run writes it: the flattened config as params."""
    cfg = OmegaConf.create(config)
    tags = {names.ROLE_TAG: names.ROLE_TRIAL, **({names.PARENT_RUN_TAG: parent} if parent else {}),
            **({names.ERROR_TAG: error} if error else {})}
    run = client.create_run(experiment_id, tags=tags)
    params = [Param(k, identity.param_text(v)) for k, v in flatten(cfg).items() if k not in drop]
    for i in range(0, len(params), 100):
        client.log_batch(run.info.run_id, params=params[i:i + 100])
    client.log_batch(run.info.run_id, metrics=[Metric("loss", 2.0 - s / 10, 1000 + s, s) for s in range(3)])
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id


def test_bookkeeping_is_no_part_of_the_identity_and_the_seed_is():
    base = _config()
    other = copy.deepcopy(base)
    other["sweep"]["budget"] = 3.0
    other["mlflow"]["experiment"] = "elsewhere"
    other["trainer"]["storage_path"] = "/somewhere/else"
    other["data"]["decode_workers"] = 4
    assert identity.identity(base) == identity.identity(other)
    seeded = copy.deepcopy(base)
    seeded["trainer"]["seed"] = 1
    assert identity.difference(identity.identity(seeded), identity.identity(base), {}) == \
        "trainer.seed: stored '0', planned '1'"


def test_an_absent_key_counts_as_its_default_and_a_changed_one_does_not():
    current = identity.identity(_config())
    stored = {k: v for k, v in current.items() if k != "trainer.compile"}  # written before trainer.compile existed
    assert identity.difference(current, stored) is None
    compiled = identity.identity(_config("trainer.compile=true"))
    assert "trainer.compile: absent from the stored trial (counts as its default 'False')" in \
        identity.difference(compiled, stored)
    old_default = dict(current, **{"optimizer.eps": "1e-06"})  # a default that changed: the stored value differs
    assert identity.difference(current, old_default).startswith("optimizer.eps: stored '1e-06'")
    removed = dict(current, **{"optimizer.gone": "1"})  # a key since removed: what it set cannot be checked
    assert identity.difference(current, removed).startswith("optimizer.gone")


def test_the_params_a_run_logs_match_its_config(tmp_path):
    """The identity compares with what the child run stores: flatten(cfg) as str, as raystream.train.run logs it."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    eid = client.create_experiment("e")
    config = _config("optimizer.lr=0.002", "sweep=table1_mini")
    rid = _store_trial(client, eid, config)
    assert identity.difference(identity.identity(config), client.get_run(rid).data.params) is None


def test_finished_trials_are_found_failed_and_stopped_ones_are_not(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    eid = client.create_experiment("e")
    the_plan = plan(compose(["sweep=smoke"]))
    configs = [c.config for c in the_plan.cells]
    assert len(configs) >= 3
    # Stored before three keys this round added: they count as their defaults.
    upgraded = ("trainer.compile", "data.decode_backend", "optimizer.triton")
    done = _store_trial(client, eid, configs[0], drop=upgraded)
    _store_trial(client, eid, configs[1], status="KILLED")  # stopped (ASHA, Ctrl-C): not reused
    _store_trial(client, eid, configs[2], status="FINISHED", error="diverged")  # failed trial: not reused
    found = identity.finished_trials(client, eid, configs)
    assert found[0] is not None and found[0].info.run_id == done
    assert found[1:] == [None] * (len(configs) - 1)


def test_a_reused_trial_is_linked_under_the_new_parent_with_its_history(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    eid = client.create_experiment("e")
    config = _config()
    old = _store_trial(client, eid, config)
    parent = client.create_run(eid, tags={names.ROLE_TAG: names.ROLE_SWEEP}).info.run_id
    run = identity.finished_trials(client, eid, [config])[0]
    link = identity.link_reused(client, run, parent, {names.RUN_NAME_TAG: "adamw-s0", names.TRIAL_TAG: "reused"})
    shown = client.get_run(link)
    assert shown.info.status == "FINISHED" and shown.info.run_name == "adamw-s0"
    assert shown.data.tags[names.PARENT_RUN_TAG] == parent
    assert shown.data.tags[identity.REUSED_FROM_TAG] == old
    assert shown.data.params == client.get_run(old).data.params
    assert [m.value for m in client.get_metric_history(link, "loss")] == pytest.approx([2.0, 1.9, 1.8])
    # The link is not itself found as a trial to reuse: the original is.
    assert identity.finished_trials(client, eid, [config])[0].info.run_id == old
