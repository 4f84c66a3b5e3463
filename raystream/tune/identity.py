"""A trial's identity: what determines its result, so a finished trial is never run twice (issue 68).

The identity is the trial's resolved config (the seed included), flattened the way its MLflow child run stores it
as params (`a.b.c -> str(value)`, cut at MLflow's param length), less the sweep's bookkeeping: the `sweep` and
`mlflow` sections, where the run is stored and named, and settings that by the project's contracts leave the
batches and the weights unchanged (decode parallelism, caches, retries, log levels, how many checkpoints are kept).

Upgrades: a key a newer raystream added is absent from a trial stored before it. It counts as equal to its
default, the value the structured schema (`raystream.config.RunConfig`) gives it, because a new key's default is
the one that keeps the older behaviour; a trial that sets it otherwise does not match. A default that changed is
no such case: the stored trial holds the old value, which differs.

`finished_trials` finds, in one MLflow experiment, the FINISHED child runs of sweeps (a failed or stopped trial is
not FINISHED) whose params match a planned trial; `link_reused` gives each one a child run under the new sweep's
parent run (its params, its metrics with their history, tag `raystream.reused_from`), so the sweep's table and the
report show it beside the trials that ran.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any, Dict, List, Mapping, Optional, Sequence

from omegaconf import OmegaConf

from raystream.tracking import names

MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value: what a child run stores of a longer one
REUSED_FROM_TAG = "raystream.reused_from"  # a reused trial's child run: the run id that ran it
IDENTITY_TAG = "raystream.identity"  # a short hash of the identity (for a reader; matching compares the params)

# Keys (or sections, ending in ".") that do not determine a trial's result.
BOOKKEEPING = (
    "sweep.", "mlflow.", "experiment",
    "trainer.storage_path", "trainer.run_name", "trainer.max_failures", "trainer.keep_checkpoints",
    "trainer.log_checkpoint_artifact", "trainer.ray_log_level", "trainer.collective_timeout_s", "trainer.log_every",
    "trainer.checkpoint_every",
    "data.decode_workers", "data.decode_timeout_s", "data.prefetch", "data.prefetch_videos", "data.cache_dir",
    "data.cache_limit_gb", "data.download_retries", "data.max_open_videos", "data.read_ahead", "data.demo.cache_dir",
)


def is_bookkeeping(key: str) -> bool:
    return any(key.startswith(b) if b.endswith(".") else key == b for b in BOOKKEEPING)


def param_text(value: Any) -> str:
    """A config value as its MLflow param holds it."""
    return str(value)[:MAX_PARAM_LENGTH]


def flat(config: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """A nested plain config as `a.b.c -> value` (lists stay values), as raystream.config.flatten writes params."""
    out: Dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flat(value, path))
        else:
            out[path] = value
    return out


def identity(config: Mapping[str, Any]) -> Dict[str, str]:
    """The trial's identity: its flattened resolved config as param text, bookkeeping left out."""
    return {k: param_text(v) for k, v in flat(config).items() if not is_bookkeeping(k)}


def digest(config: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(identity(config), sort_keys=True).encode()).hexdigest()[:12]


@lru_cache(maxsize=1)
def schema_defaults() -> Dict[str, str]:
    """Every key's default in the structured schema, as param text (what an absent stored key counts as)."""
    from raystream.config import RunConfig  # lazy: the schema imports every package's config

    return {k: param_text(v) for k, v in flat(OmegaConf.to_container(OmegaConf.structured(RunConfig))).items()}


def difference(current: Mapping[str, str], stored: Mapping[str, str],
               defaults: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """None when a stored trial's params (`stored`) match the identity `current`; else the first key that differs,
    said. A key absent from `stored` matches when `current` holds its schema default. A stored key that the
    current config lacks (a key since removed or renamed) does not match: what it set cannot be checked."""
    defaults = schema_defaults() if defaults is None else defaults
    for key, value in current.items():
        if key in stored:
            if stored[key] != value:
                return f"{key}: stored {stored[key]!r}, planned {value!r}"
        elif key not in defaults:
            return f"{key}: absent from the stored trial, and no default to count it as"
        elif defaults[key] != value:
            return f"{key}: absent from the stored trial (counts as its default {defaults[key]!r}), planned {value!r}"
    for key in stored:
        if key not in current and not is_bookkeeping(key):
            return f"{key}: stored {stored[key]!r}, not a key of the planned config"
    return None


def finished_trials(client, experiment_id: str, configs: Sequence[Mapping[str, Any]]) -> List[Optional[Any]]:
    """For each planned trial config, a FINISHED sweep-trial run of `experiment_id` with the same identity (the most
    recent one), or None. Runs that are themselves reused links are skipped: the original is found instead."""
    runs = _finished_trial_runs(client, experiment_id)
    defaults = schema_defaults()
    found: List[Optional[Any]] = []
    for config in configs:
        current = identity(config)
        found.append(next((r for r in runs if difference(current, r.data.params, defaults) is None), None))
    return found


def find_reused(client, experiment_id: str, the_plan: Any) -> Dict[int, Any]:
    """cell index -> a FINISHED trial run in the experiment with the cell's identity, for a sweep plan
    (raystream/tune/space.py `SweepPlan`). Only a sweep whose trials are its cells (no sampled axes, one sample a
    cell) can know a trial's identity before it runs. The sweep (study_search.py) and its plan (plan_measured.py)
    both ask here."""
    if the_plan.sample or the_plan.num_samples != 1:
        return {}
    found = finished_trials(client, experiment_id, [c.config for c in the_plan.cells])
    return {i: run for i, run in enumerate(found) if run is not None}


def _finished_trial_runs(client, experiment_id: str) -> List[Any]:
    query = (f"tags.`{names.ROLE_TAG}` = '{names.ROLE_TRIAL}' and attributes.status = 'FINISHED'")
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=query, max_results=1000, page_token=token,
                                  order_by=["attributes.start_time DESC"])
        runs += [r for r in page if REUSED_FROM_TAG not in r.data.tags and names.ERROR_TAG not in r.data.tags]
        token = page.token
        if not token:
            return runs


def link_reused(client, run, parent_run_id: str, tags: Mapping[str, str]) -> str:
    """A child run of `parent_run_id` that shows the finished trial `run`: its params, every metric's history, its
    start and end times, `tags` (the new sweep's trial tags) and `raystream.reused_from`. Returns its run id."""
    from mlflow.entities import Metric, Param  # lazy: MLflow only where a sweep runs

    parent = client.get_run(parent_run_id)
    shown = {**{k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}, **tags,
             names.PARENT_RUN_TAG: parent_run_id, REUSED_FROM_TAG: run.info.run_id}
    new = client.create_run(parent.info.experiment_id, start_time=run.info.start_time,
                            tags=shown, run_name=tags.get(names.RUN_NAME_TAG) or run.info.run_name)
    run_id = new.info.run_id
    params = [Param(k, v) for k, v in run.data.params.items()]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i:i + 100])
    for key in run.data.metrics:
        history = [Metric(key, m.value, m.timestamp, m.step) for m in client.get_metric_history(run.info.run_id, key)]
        for i in range(0, len(history), 1000):
            client.log_batch(run_id, metrics=history[i:i + 1000])
    client.set_terminated(run_id, "FINISHED", end_time=run.info.end_time)
    return run_id
