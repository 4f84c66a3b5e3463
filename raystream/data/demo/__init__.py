"""The generated demo videos: frames rendered from bundled images (render.py), encoded to mp4 (encode.py), cached
by their config (videos.py). A stream with `data.videos` None reads them; nothing here knows of streams."""
