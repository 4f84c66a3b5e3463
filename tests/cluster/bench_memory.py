"""`raystream bench`'s two memory phases (raystream/bench/main.py `correlation_phase`, `training_phase`) on the CPU, in
a fresh interpreter, so that the resident set before the model is built is the command's and not a test session's:

    python bench_memory.py overrides...   -> one JSON line: the phases' figures (bench's JSON keys)
"""

import json
import sys


def main(overrides) -> None:
    import torch

    from raystream.bench import main as bench, memory
    from raystream.bench.trainee import Budget, Trainee
    from raystream.config import compose

    cfg = compose(overrides)
    device = torch.device("cpu")
    meter = memory.PeakMemory(device, memory.rss())
    trainee = Trainee.build(cfg, device, total_steps=10 ** 6)
    out = bench.correlation_phase(trainee, meter)
    peak, (_, checkpoint_bytes) = bench.training_phase(trainee, meter, 1, Budget(600), warmup=1)
    out.update(peak.figures(""), checkpoint_bytes=checkpoint_bytes, peak_memory_how=meter.how)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
