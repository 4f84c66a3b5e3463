"""Where the videos are: listing what a config names (listing.py), objects of a store (remote.py), the node cache
(cache.py) and fetching ahead of a stream (prefetch.py), each video's facts from its index (index.py) or a probe
(probing.py, which decodes in a child process). Uses decode/ to read a file; knows nothing of orders or streams."""
