"""How frames are decoded: decord / PyAV readers (backends.py, exact.py), crop and scale geometry (frames.py),
segment jobs (plan.py) and the threads that decode them (workers.py). Knows nothing of orders, streams or where a
video came from: it is handed local paths and frame indices."""
