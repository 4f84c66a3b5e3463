"""raystream.data: decoded video clip streams in the paper's batching orders, sharded and resumable. No Ray.

    from raystream.data import build_stream, build_heldout_stream, ensure_demo_videos, load_probe_set, DataError, Batch

Where things live: `orders.py` (Figure 4's orders as index arithmetic), `clips.py` (which frames a clip holds),
`backends.py` (decord / PyAV readers), `frames.py` (crop and scale geometry), `sources.py` (listing and probing
files), `remote.py` (listing objects of a bucket), `cache.py` (the node cache those are downloaded into),
`prefetch.py` (downloads ahead of a stream), `index.py` (`raystream data index`: frames and fps without probing),
`plan.py` (which segment jobs decode which frames), `workers.py` (decode threads), `stream.py` (batches, sharding,
state), `device.py` (batches copied to the training device ahead of the step), `demo.py` (generated demo videos),
`probe.py` (labelled probe sets), `inspect.py` (`raystream data inspect`).

Names are imported lazily, so the probe child process (`python -m raystream.data.sources`) starts without torch.
"""

from importlib import import_module

_EXPORTS = {
    "Batch": "stream", "ClipRef": "stream", "ClipStream": "stream", "build_stream": "stream",
    "build_heldout_stream": "stream", "ClipGeometry": "clips", "DataError": "errors", "ORDERS": "orders",
    "Order": "orders", "shard_places": "orders", "ProbeSet": "probe", "load_probe_set": "probe",
    "ensure_demo_videos": "demo", "DeviceStream": "device",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"raystream.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'raystream.data' has no attribute {name!r}")


def __dir__():
    return __all__
