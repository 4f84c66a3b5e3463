"""torch.distributed's listeners on the loopback interface when a run's workers all share one node.

Ray Train's `TorchConfig` has the worker of rank 0 host torch.distributed's rendezvous store (a `TCPStore`), which
listens on every interface (`*:<port>`) whatever `MASTER_ADDR` says, and gloo's (NCCL's bootstrap) sockets on
the address the host name resolves to. On one node nothing outside it needs them, so `LoopbackTorchConfig` (what
`fit` passes to the `TorchTrainer`) does Ray's set-up with two changes when every worker runs on the same node:
rank 0 serves the store from a socket bound to 127.0.0.1 (`TCPStore(master_listen_fd=...)`) and every rank is
its client (`TORCHELASTIC_USE_AGENT_STORE`, torch's switch for a store hosted outside the ranks), and gloo / NCCL
use the loopback interface (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`, unless set). Workers on several nodes
get Ray's set-up unchanged: the store must be reachable from the other nodes (cluster/README.md, Security).
This reuses Ray Train 2.60's private set-up steps (`ray.train.torch.config`): import this module only through
`raystream.train.torch_backend.torch_config()`, which checks that the installed Ray is a tested version with those
names, and gives the run Ray's stock `TorchConfig` (saying so) when it is not. Workers with TPUs also get Ray's
set-up (its `tpu_dist` backend).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, Optional

import ray
import torch.distributed as dist
from ray.train.torch import TorchConfig
# Private: checked by raystream/train/torch_backend.py (PRIVATE_API) before this module is imported.
from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group, _TorchBackend

LOOPBACK = "127.0.0.1"
_SERVED: Optional[Any] = None  # rank 0's (TCPStore, listening socket): kept for the worker process's life


def loopback_interface() -> Optional[str]:
    """The loopback interface's name (`lo` on Linux, `lo0` on macOS), or None."""
    try:
        return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
    except OSError:
        return None


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _serve_store(timeout_s: int) -> int:
    """On rank 0: a TCPStore server listening on 127.0.0.1 only; its port."""
    global _SERVED

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = dist.TCPStore(LOOPBACK, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False,
                          master_listen_fd=sock.fileno())
    _SERVED = (store, sock)
    return port


def _use_store(port: int) -> None:
    """On every rank: rendezvous as a client of the store on 127.0.0.1:`port`, collectives over loopback."""
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    interface = loopback_interface()
    if interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)


def backend_name(backend: Optional[str], resources_per_worker: Dict[str, float]) -> Optional[str]:
    """torch.distributed's backend as Ray's set-up picks it (`backend`, else NCCL for GPU workers, gloo for CPU
    ones); None for TPU workers, which keep Ray's own set-up."""
    if backend == "tpu_dist" or resources_per_worker.get("TPU", 0) > 0:
        return None
    return backend or ("nccl" if resources_per_worker.get("GPU", 0) > 0 else "gloo")


class _LoopbackTorchBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config) -> None:
        backend = backend_name(backend_config.backend, worker_group.get_resources_per_worker())
        if backend is None or len(set(worker_group.execute(_node_id))) != 1:
            return super().on_start(worker_group, backend_config)

        port = worker_group.execute_single(0, _serve_store, int(backend_config.timeout_s))
        worker_group.execute(_use_store, port=port)
        worker_group.execute(_set_torch_distributed_env_vars)
        ray.get([worker_group.execute_single_async(i, _setup_torch_process_group, backend=backend, world_rank=i,
                                                   world_size=len(worker_group), init_method="env://",
                                                   timeout_s=backend_config.timeout_s)
                 for i in range(len(worker_group))])


@dataclass
class LoopbackTorchConfig(TorchConfig):
    """`TorchConfig` whose listeners stay on 127.0.0.1 when all workers share one node (module docstring)."""

    @property
    def backend_cls(self):
        return _LoopbackTorchBackend
