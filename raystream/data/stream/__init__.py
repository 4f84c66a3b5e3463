"""The stream: Figure 4's orders (orders.py) x the checked videos (videos/) x the decoder (decode/), owning the
state. clips.py says which frames a clip holds, batches.py assembles and shards batches (ClipStream), build.py
makes one from a config, device.py copies batches ahead to the training device, inspect.py is `raystream data
inspect`."""
