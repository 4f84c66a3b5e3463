"""Starting or joining Ray on the driver, the same way for `raystream train` and `raystream sweep`.

`RAY_ADDRESS` set (or Ray already initialised): join that cluster as it is. Otherwise a local cluster is started
with its node address on the loopback interface (`_node_ip_address="127.0.0.1"`), so the GCS address and the
node Ray advertises are local only; the dashboard keeps Ray's default host, 127.0.0.1. What Ray 2.60 does not let a
caller bind: its gRPC servers (GCS, raylet, core workers) and the metrics agent's Prometheus endpoint listen on
all interfaces whatever the node address (README, "Files and services"); run on a host whose firewall keeps
those ports private.
"""

from __future__ import annotations

import os

LOCAL_NODE_IP = "127.0.0.1"


def start_ray() -> None:
    """`ray.init()` for a raystream driver: the cluster of `RAY_ADDRESS`, else a local one bound to loopback."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    ray.init(_node_ip_address=LOCAL_NODE_IP)
