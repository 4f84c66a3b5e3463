"""`raystream.tune.concurrency`: trials in flight from what the cluster can grow to, or sweep.max_concurrent_trials."""

from __future__ import annotations

from raystream.config import compose
from raystream.tune.concurrency import trial_demand, trials_in_flight
from raystream.tune.space import plan


def test_trial_demand_counts_every_worker():
    assert trial_demand({"num_workers": 2, "cpus_per_worker": 4.0, "use_gpu": True}) == {"CPU": 8.0, "GPU": 2.0}
    assert trial_demand({"num_workers": 1, "cpus_per_worker": 1.0, "use_gpu": False}) == {"CPU": 1.0}


def test_sized_from_what_the_cluster_can_grow_to_not_from_what_it_has():
    gpu = ["trainer.use_gpu=true", "trainer.cpus_per_worker=4"]
    p = plan(compose(gpu), gpu)  # smoke: 4 one-GPU trials
    at_start = {"CPU": 4.0}  # the CPU head of cluster/aws.yaml before any GPU node: one trial, never scales out
    assert trials_in_flight(None, p, at_start) == 1
    grown = {"CPU": 4.0 + 3 * 8, "GPU": 3.0}  # 3 one-GPU nodes allowed
    assert trials_in_flight(None, p, grown) == 3
    assert trials_in_flight(None, p, {"CPU": 400.0, "GPU": 40.0}) == 4  # at most the sweep's trials
    assert trials_in_flight(2, p, grown) == 2  # sweep.max_concurrent_trials wins
