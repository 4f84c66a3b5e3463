"""A node's system metrics in its MLflow run, for the run's "System metrics" tab: one `NodeMonitor` per node.

MLflow's own `SystemMetricsMonitor` samples the machine every `mlflow.system_metrics_interval_s` seconds in a
thread and logs `system/...` metrics to the run: CPU utilisation, system memory, disk, network received and sent
since the monitor started (psutil), and, where nvidia-ml-py (`pynvml`) is installed, each NVIDIA GPU of the machine:
utilisation, memory, power. With several nodes each node's names carry its label (`system/node_1/...`), so the
nodes' series stay apart. Steps continue from the run's last system step, so a restarted or resumed run appends.

A monitor never stops training: one that cannot start (the tracking store does not answer) is said on stderr and
the run goes on without it (its start fails fast), and `stop` waits at most `STOP_WAIT_S` for the last samples to be
written. MLflow's sampling thread itself ends at the first tracking call that fails (after MLflow's retries): a
tracking outage ends the node's samples until the workers (re)start.
The interval is raystream's config key: MLflow's `MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL` does not override it.
Ray-free: which process monitors a node is raystream/train/node_metrics.py's choice.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Optional

from raystream.tracking.store import failing_fast

STOP_WAIT_S = 15.0  # the longest the end of a run waits for the monitor's last samples


def node_label(node_rank: int, several_nodes: bool) -> Optional[str]:
    """The label in a node's metric names: `node_<rank>` when the run spans several nodes, else None (the plain
    `system/...` names MLflow's UI expects)."""
    return f"node_{node_rank}" if several_nodes else None


class NodeMonitor:
    """MLflow's `SystemMetricsMonitor` on `run_id`, started by `start` and ended by `stop`."""

    def __init__(self, monitor):
        self._monitor = monitor

    @classmethod
    def start(cls, uri: str, run_id: str, interval_s: float, node: Optional[str] = None,
              gpus: bool = False) -> Optional["NodeMonitor"]:
        """Sample this machine every `interval_s` seconds into run `run_id` of the store at `uri`, under
        `system/<node>/` when `node` is given. `gpus`: this node has GPUs (without nvidia-ml-py their metrics are
        missing, which is said). None, said on stderr, when the monitor cannot start."""
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop lines on the console
        where = f" of {node}" if node else ""
        try:
            from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor  # psutil: raystream's dependency
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor  # lazy: a failure is said

            # It reads the run (resume_logging): a server that does not answer must not hold the workers' start.
            with failing_fast():
                monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True,
                                               node_id=node, tracking_uri=uri)
        except Exception as exc:  # the store did not answer (resume_logging reads the run), psutil missing, ...
            print(f"raystream: no system metrics{where} for MLflow run {run_id}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            return None
        monitor.sampling_interval = interval_s  # the config key, whatever MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL says
        if gpus and not any(isinstance(m, GPUMonitor) for m in monitor.monitors):
            print(f"raystream: system metrics{where} without the GPUs: MLflow reads them with nvidia-ml-py "
                  "(pip install nvidia-ml-py on every GPU node)", file=sys.stderr, flush=True)
        monitor.start()
        return cls(monitor)

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """Write the samples taken since the last write and end the thread; waits at most `wait_s` (a store that
        does not answer loses those last samples, never the run)."""
        done = threading.Thread(target=self._monitor.finish, name="raystream-system-metrics-stop", daemon=True)
        done.start()
        done.join(wait_s)
