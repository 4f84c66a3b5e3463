"""Where the videos are. Uses decode/ to read a file; knows nothing of orders or streams.

    listing.py            which video files a config names, and the facts a checked video carries (VideoInfo)
    remote.py             videos in an object store: the objects a URI names, with their sizes
    cache.py              the node cache: store videos downloaded once per node, whole
    prefetch.py           store videos fetched into the node cache ahead of the steps that read them
    index.py              the per-directory video index: frames, fps and size before step 0, without decoding
    probing.py            each listed video checked before a stream starts (in a child process)
"""
