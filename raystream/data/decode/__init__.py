"""How frames are decoded. Knows nothing of orders, streams or where a video came from: it is handed local paths and
frame indices.

    backends.py           the decoders behind one reader interface: which imports, which reads a file, opening one
    torchcodec_reader.py  torchcodec's reader (CPU, or NVDEC on a GPU)
    decord_reader.py      decord's reader
    pyav_reader.py        PyAV's reader: the decoder every platform has
    exact.py              whether a decoder reads a file's frames as its container lays them out
    frames.py             frame geometry: centre crop to a square, resize to the stream's resolution
    plan.py               segment jobs: which frames each decode job reads, which job each step's frames come from
    workers.py            decode workers (threads or processes) running the plan's jobs; the backend choice
    processes.py          decode workers as child processes decoding into shared memory (the parent's side)
    processes_child.py    a decode process's side: the loop a child runs (`python -m ...processes_child`)
"""
