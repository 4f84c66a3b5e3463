"""The stream: Figure 4's orders x the checked videos (videos/) x the decoder (decode/), owning the state.

    orders.py             the batching orders of Figure 4 as index arithmetic; sharding places over ranks
    clips.py              which source frames make up clip k of a video (frames_per_clip, fps, clip_shift)
    batches.py            ClipStream: the clips at each step, decoded once, sharded, resumable
    batch.py              Batch, ClipRef: what a stream yields; a batch assembled from decoded frames
    build.py              build_stream: the videos a config names, checked, cut into clips and sharded
    device.py             DeviceStream: batches copied a step ahead to the training device, made float there
    inspect.py            `raystream data inspect`: which source frames each batch holds, as JSON lines
"""
