"""How many trials a sweep keeps in flight (Tune's `max_concurrent_trials`).

`sweep.max_concurrent_trials` when set; else as many Train runs as fit on what the cluster can grow to
(`raystream.train.capacity.cluster_capacity`: its resources now, or with every autoscaled node type at its
`max_workers`), at most the number of trials. Sizing from the resources present when the sweep starts would give
one trial on a cluster whose GPU nodes start at `min_workers: 0`, and one pending trial makes the autoscaler add one
node: the sweep would never scale out. Trials beyond what runs at once wait in Tune's queue, not as pending
placement groups, so a fixed cluster is never oversubscribed.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from raystream.train.capacity import cluster_capacity
from raystream.tune.space import SweepPlan


def trial_demand(trainer: Mapping[str, Any]) -> Dict[str, float]:
    """Resources one trial's Train run holds: `num_workers` x (`cpus_per_worker` CPUs [+ 1 GPU with use_gpu]).
    (The trial's own driver asks for no CPU: it waits on its Train run.)"""
    workers = int(trainer["num_workers"])
    demand = {"CPU": workers * float(trainer["cpus_per_worker"])}
    if trainer["use_gpu"]:
        demand["GPU"] = float(workers)
    return demand


def concurrent_trials(the_plan: SweepPlan, resources: Mapping[str, float]) -> int:
    """Trials whose Train runs fit on `resources` at once (the cell needing most decides), 1 to the plan's trials."""
    fits = [the_plan.num_trials]
    for cell in the_plan.cells:
        for resource, amount in trial_demand(cell.config["trainer"]).items():
            if amount > 0:
                fits.append(int(float(resources.get(resource, 0.0)) // amount))
    return max(1, min(fits))


def trials_in_flight(explicit: Optional[int], the_plan: SweepPlan,
                          capacity: Optional[Mapping[str, float]] = None) -> int:
    """`explicit` (`sweep.max_concurrent_trials`) when set, else `concurrent_trials` on `capacity` (default:
    what the connected cluster can grow to)."""
    if explicit:
        return int(explicit)
    if capacity is None:
        capacity = cluster_capacity()
    return concurrent_trials(the_plan, capacity)
