"""raystream.data: decoded video clip streams in the paper's batching orders, sharded and resumable. No Ray.

    from raystream.data import build_stream, build_heldout_stream, ensure_demo_videos, DataError, Batch

Three rooms, with arrows one way (stream -> videos -> decode, stream -> decode, demo; tests/test_imports.py):
- `videos/`: where the videos are: listing what a config names, objects of a store, the node cache, prefetching,
  the per-directory index, and probing each video's frame count, fps and size (in a child process).
- `decode/`: how frames are decoded: decord / PyAV readers, crop and scale geometry, segment plans, decode
  threads. It is handed local files and frame indices and knows nothing of orders.
- `stream/`: Figure 4's orders x the checked videos x the decoder, owning the state (`ClipStream`, `build_stream`,
  `DeviceStream`, `raystream data inspect`).
Beside them: `config.py` (the typed schema), `errors.py` (DataError) and `demo/` (the generated demo videos). The
labelled probe sets live in raystream/eval/labelled_videos.py.

Names are imported lazily (on first use), so the probe child process (`python -m raystream.data.videos.probing`),
which imports this package first, starts without torch.
"""

from importlib import import_module

_EXPORTS = {
    "Batch": "stream.batches", "ClipRef": "stream.batches", "ClipStream": "stream.batches",
    "build_stream": "stream.build", "build_heldout_stream": "stream.build", "DeviceStream": "stream.device",
    "ClipGeometry": "stream.clips", "ORDERS": "stream.orders", "Order": "stream.orders",
    "shard_places": "stream.orders", "DataError": "errors", "ensure_demo_videos": "demo.videos",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"raystream.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'raystream.data' has no attribute {name!r}")


def __dir__():
    return __all__
