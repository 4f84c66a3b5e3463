"""The driver of test_e2e_autoscaling.py: a `raystream sweep` (the real `run_sweep`: plan, MLflow parent run,
Tune, trials in flight from `raystream.tune.concurrency`) on an autoscaling Ray cluster, with a trial function whose
Train workers need the cluster's GPU-like resource. It records which nodes are alive while the sweep runs and
until the idle nodes are gone, and writes everything to a JSON file.

    python tests/e2e/autoscaling_driver.py <gcs address> <work dir> <out.json>

Run as a script: `fit` below is pickled by value (it lives in `__main__`) into each trial.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

GPU_LIKE = "gpu_like"  # the custom resource standing in for a GPU (only the autoscaled worker type has it)
STEP_S = 2.0  # seconds per training step: trials last long enough to overlap
IDLE_WAIT_S = 150  # after the sweep, how long to wait for the autoscaler to remove the idle nodes


def _loop(config):
    import ray.train

    started = time.time()  # the worker holds its GPU-like unit from here
    for step in range(config["steps"]):
        time.sleep(config["step_s"])
        ray.train.report({"loss": 1.0 / (step + 1), "step": step})
    os.makedirs(os.path.dirname(config["times_file"]), exist_ok=True)
    with open(config["times_file"], "w") as f:  # one machine: the driver reads it back
        json.dump({"started": started, "ended": time.time()}, f)


def fit(cfg, *, run_name=None, callbacks=None, mlflow_parent_run_id=None, mlflow_tags=None):
    """`raystream.train.run.fit`'s signature: one Ray Train run whose workers each take one GPU-like unit."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    times_file = f"{cfg.trainer.storage_path}/{run_name}.times.json"
    trainer = TorchTrainer(
        _loop, train_loop_config={"steps": int(cfg.trainer.max_steps), "step_s": STEP_S, "times_file": times_file},
        scaling_config=ScalingConfig(num_workers=int(cfg.trainer.num_workers),
                                     resources_per_worker={"CPU": float(cfg.trainer.cpus_per_worker), GPU_LIKE: 1}),
        run_config=RunConfig(name=run_name, storage_path=cfg.trainer.storage_path, callbacks=list(callbacks or [])))
    trainer.fit()
    with open(times_file) as f:
        times = json.load(f)  # when its worker trained (not the wait for a node)
    return {"loss": 1.0 / int(cfg.trainer.max_steps), **times, "driver_node": ray.get_runtime_context().get_node_id()}


def _gpu_like_nodes():
    import ray

    return sorted(n["NodeID"][-5:] for n in ray.nodes() if n["Alive"] and n["Resources"].get(GPU_LIKE, 0) > 0)


def main(gcs: str, work: str, out: str) -> None:
    import ray

    from raystream.config import compose
    from raystream.tune.concurrency import trials_in_flight
    from raystream.tune.space import plan
    from raystream.tune.sweep import run_sweep

    ray.init(address=gcs, log_to_driver=False)
    t0 = time.time()
    timeline, stop = [], threading.Event()

    def watch():
        last = None
        while not stop.is_set():
            nodes = _gpu_like_nodes()
            if nodes != last:
                timeline.append({"t": round(time.time() - t0, 1), "gpu_like_nodes": nodes})
                last = nodes
                with open(f"{work}/timeline.json", "w") as f:  # so far, for a test that times out
                    json.dump(timeline, f)
            stop.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # 2 trials (smoke's optimizer axis, its order axis collapsed): as many as the cluster can grow to, so every
    # trial waits for a node and none waits for another trial (a trial after another ran on a node idle for ~16 s,
    # which the idle timeout could remove under it).
    overrides = ["sweep=smoke", "stream.order=shuffled",
                 "sweep.grid.optimizer.name=[adamw,orthogonal_adamw]",
                 "trainer.max_steps=4", f"trainer.storage_path={work}/results",
                 f"mlflow.tracking_uri=sqlite:///{work}/mlflow.db", "mlflow.experiment=autoscaling"]
    cfg = compose(overrides)
    in_flight = trials_in_flight(cfg.sweep.max_concurrent_trials, plan(cfg, overrides))
    print(f"trials in flight: {in_flight}", flush=True)
    outcome = run_sweep(cfg, overrides, fit=fit, verbose=1)
    print(f"sweep done: {[(t.trial_id, t.status, t.error) for t in outcome.trials]}", flush=True)
    sweep_done = time.time() - t0
    deadline = time.time() + IDLE_WAIT_S
    while time.time() < deadline and _gpu_like_nodes():
        time.sleep(1)
    time.sleep(1)
    stop.set()
    watcher.join()
    with open(out, "w") as f:
        json.dump({"in_flight": in_flight, "sweep_done_s": round(sweep_done, 1),
                   "end_s": round(time.time() - t0, 1), "timeline": timeline,
                   "trials": [{"id": t.trial_id, "status": t.status, "error": t.error,
                               "started": t.metrics["started"] - t0 if "started" in t.metrics else None,
                               "ended": t.metrics["ended"] - t0 if "ended" in t.metrics else None,
                               "driver_node": str(t.metrics.get("driver_node", ""))[-5:]}
                              for t in outcome.trials]}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
