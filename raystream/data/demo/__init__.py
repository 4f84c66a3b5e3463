"""The generated demo videos: a stream with `data.videos` None reads them; nothing here knows of streams.

    render.py             the demo videos' frames, rendered from images bundled in installed packages
    encode.py             mp4 files written with PyAV (libx264): the demo videos and the tests' frame-index videos
    videos.py             the demo videos as real mp4 files, cached by their config
    probe_images.py       labelled image probe sets generated from packages, as ImageFolders
"""
