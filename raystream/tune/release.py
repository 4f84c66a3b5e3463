"""Give a stopped trial's Train workers back to the cluster.

When ASHA stops a trial, Tune kills the trial's driver actor. Ray Train's controller and workers die with it, but
their placement group does not: placement groups live as long as the *job*. Ray Train V2 starts a detached
`PlacementGroupCleaner` for this, which asks the State API whether the controller is alive; with no dashboard
(`ray.init(include_dashboard=False)`, or a joined cluster's dashboard that this host cannot reach) it cannot, the
CPUs stay reserved and the next trials wait forever (raystream/train/ray_start.py: where a local cluster's
cleaner asks). So raystream records each Train run's placement group (`RecordPlacementGroup`, a
Train callback running in the controller) in Ray's internal KV under the trial id, and the sweep driver's
`ReleaseStoppedTrials` (a Tune callback) removes whatever a finished, stopped or failed trial left behind.
A run that ended normally has already removed its group: then this does nothing.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Dict, List

import ray
from ray.experimental import internal_kv
from ray.tune import Callback
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

logger = logging.getLogger(__name__)
KV_PREFIX = "raystream:train_pg:"
GRACE_S = 3.0  # wait this long after a trial ends (its actor is being killed) before removing its groups
WATCH_S = 60.0  # and keep removing groups it recorded for this long


def _key(trial_id: str) -> bytes:
    return f"{KV_PREFIX}{trial_id}".encode()


def _kv():
    return internal_kv


try:  # Ray Train V2's internal worker-group callback: the only hook that sees the placement group.
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback as _Base
except ImportError:  # pragma: no cover - a Ray without it: nothing to record, the cleaner is on its own
    _Base = object


class RecordPlacementGroup(_Base):
    """Train callback (runs in the Train controller): note each worker group's placement group for `trial_id`."""

    def __init__(self, trial_id: str):
        self.trial_id = trial_id

    def after_worker_group_start(self, worker_group) -> None:
        try:
            pg = worker_group.get_worker_group_state().placement_group_handle.placement_group
            kv = _kv()
            old = kv._internal_kv_get(_key(self.trial_id))
            ids = json.loads(old) if old else []
            ids.append(pg.id.hex())
            kv._internal_kv_put(_key(self.trial_id), json.dumps(ids).encode(), overwrite=True)
        except Exception as exc:  # never fail a training run over bookkeeping
            logger.warning("raystream: could not record the placement group of trial %s: %s", self.trial_id, exc)


def release(trial_id: str) -> List[str]:
    """Remove the placement groups trial `trial_id`'s Train runs recorded that are still reserved."""
    raw = _kv()._internal_kv_get(_key(trial_id))
    removed = []
    for hex_id in json.loads(raw) if raw else []:
        state = placement_group_table().get(hex_id, {}).get("state")
        if state in (None, "REMOVED"):
            continue
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(hex_id))))
        removed.append(hex_id)
    return removed


class ReleaseStoppedTrials(Callback):
    """Tune callback (runs in the sweep driver): release each ended trial's leftover Train placement groups."""

    def __init__(self):
        self._ended: Dict[str, float] = {}

    def _end(self, trial) -> None:
        self._ended[trial.trial_id] = time.monotonic()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trial)

    def _sweep(self, final: bool = False) -> None:
        now = time.monotonic()
        for trial_id, ended in list(self._ended.items()):
            if final or now - ended >= GRACE_S:
                removed = release(trial_id)
                if removed:
                    logger.info("raystream: released %d placement group(s) of stopped trial %s",
                                len(removed), trial_id)
            if final or now - ended >= WATCH_S:
                del self._ended[trial_id]

    def on_step_begin(self, iteration, trials, **info):
        self._sweep()

    def on_experiment_end(self, trials, **info):
        self._sweep(final=True)
