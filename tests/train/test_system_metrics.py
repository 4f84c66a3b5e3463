"""MLflow system metrics of a run's nodes (raystream/tracking/system_metrics.py, raystream/train/node_metrics.py):
off unless `mlflow.system_metrics_interval_s` is set; when set, a real 2-worker run on this one node logs the
node's CPU, memory and network to its MLflow run (sqlite), sampled by one process (the worker of local rank 0): that
run is tests/train/test_fit.py's `ddp` run, which turns them on (one Ray Train run fewer in the suite).
GPU metrics need a GPU and nvidia-ml-py: not here. Several nodes need a multi-node cluster: only their names are
checked here (`node_label`)."""

import pytest

from raystream.config import ConfigError, compose
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
