"""MLflow system metrics of a run's nodes (raystream/tracking/system_metrics.py, raystream/train/node_metrics.py):
off unless `mlflow.system_metrics_interval_s` is set; when set, a real 2-worker run on this one node logs the
node's CPU, memory and network to its MLflow run (sqlite), sampled by one process (the worker of local rank 0).
GPU metrics need a GPU and nvidia-ml-py: not here. Several nodes need a multi-node cluster: only their names are
checked here (`node_label`)."""

import pytest

from raystream.config import ConfigError, compose
from raystream.tracking import client as make_client
from raystream.tracking.config import TrackingConfig
from raystream.tracking.system_metrics import node_label


def test_off_by_default_and_the_interval_is_checked():
    assert TrackingConfig().system_metrics_interval_s is None
    assert compose(["mlflow.system_metrics_interval_s=0"]).mlflow.system_metrics_interval_s == 0
    with pytest.raises(ConfigError, match=r"mlflow\.system_metrics_interval_s.*at least 0\.5 seconds"):
        compose(["mlflow.system_metrics_interval_s=0.1"])


def test_nodes_are_named_apart_only_when_a_run_spans_several():
    assert node_label(0, several_nodes=False) is None  # MLflow's plain system/<metric>
    assert [node_label(r, several_nodes=True) for r in (0, 1)] == ["node_0", "node_1"]


@pytest.mark.slow
def test_a_run_logs_its_node_cpu_memory_and_network_once_per_sample(ray_cluster, tiny, workdir, monkeypatch):
    from raystream.train.run import fit

    monkeypatch.setenv("RAYSTREAM_STEP_DELAY_S", "0.5")  # 4 steps of at least 0.5 s: several samples
    cfg = tiny("trainer.num_workers=2", "trainer.max_steps=4", "trainer.correlation_steps=0",
               "mlflow.system_metrics_interval_s=0.5")
    run_id = fit(cfg, run_name="system-metrics")["mlflow_run_id"]
    client = make_client(workdir["mlflow"])
    keys = {k for k in client.get_run(run_id).data.metrics if k.startswith("system/")}
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
                "system/system_memory_usage_percentage", "system/network_receive_megabytes",
                "system/network_transmit_megabytes"):
        assert key in keys, f"{key} not logged; system metrics: {sorted(keys)}"
    assert not any(k.startswith("system/node_") for k in keys), sorted(keys)  # one node: MLflow's plain names
    steps = sorted(m.step for m in client.get_metric_history(run_id, "system/cpu_utilization_percentage"))
    # Two monitors (one per worker) would each log steps 0, 1, ...: one per node logs each step once.
    assert len(steps) >= 2 and steps == list(range(len(steps))), steps
    memory = client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
    assert all(m.value > 0 for m in memory), [m.value for m in memory]


def test_a_tracking_server_that_does_not_answer_neither_holds_nor_fails_the_worker():
    """A server on a port nobody listens on: the monitor starts without waiting out MLflow's retries (minutes), and
    `stop` returns after at most its wait while MLflow's thread is still retrying."""
    import socket
    import time

    from raystream.tracking.system_metrics import NodeMonitor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: refused
    t0 = time.monotonic()
    monitor = NodeMonitor.start(f"http://127.0.0.1:{port}", "0" * 32, interval_s=0.5)
    started = time.monotonic() - t0
    assert started < 30, f"the monitor took {started:.0f} s to start"
    time.sleep(1.0)  # its first sample: MLflow's thread now retries reading the run
    if monitor is not None:
        t1 = time.monotonic()
        monitor.stop(wait_s=2.0)
        assert time.monotonic() - t1 < 10
