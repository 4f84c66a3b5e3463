"""`raystream bench`'s two memory phases (raystream/bench/main.py `correlation_phase`, `training_phase`) on the CPU, in
a fresh interpreter, so that the resident set before the model is built is the command's and not a test session's.
The phases run twice, and the second time is measured: the first maps the libraries' pages the phases touch and
makes their lazy imports (decoders, kernels: 50-150 MB of resident set that differed between two checkouts of the
same commit), which is not memory the run's tensors hold and not what cluster/gpu_memory.py estimates.

    python bench_memory.py overrides...   -> one JSON line: the phases' figures (bench's JSON keys)
"""

import ctypes
import gc
import json
import sys


def main(overrides) -> None:
    import torch

    from raystream.bench import main as bench, memory
    from raystream.bench.trainee import Budget, Trainee
    from raystream.config import compose

    cfg = compose(overrides)
    device = torch.device("cpu")
    warm = Trainee.build(cfg, device, total_steps=10 ** 6)
    bench.correlation_phase(warm, memory.PeakMemory(device, memory.rss()))
    bench.training_phase(warm, memory.PeakMemory(device, memory.rss()), 1, Budget(600), warmup=1)
    del warm
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    meter = memory.PeakMemory(device, memory.rss())
    trainee = Trainee.build(cfg, device, total_steps=10 ** 6)
    out = bench.correlation_phase(trainee, meter)
    peak, (_, checkpoint_bytes) = bench.training_phase(trainee, meter, 1, Budget(600), warmup=1)
    out.update(peak.figures(""), checkpoint_bytes=checkpoint_bytes, peak_memory_how=meter.how)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
