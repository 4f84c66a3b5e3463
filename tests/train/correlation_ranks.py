"""One rank of the stream-correlation measurement in a real gloo process group (tests/train/test_correlation.py).

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python correlation_ranks.py OUT.json STEPS MICRO overrides...

Every rank builds the scenario and its own shard's stream as a Ray Train worker would; rank 0 writes the figures.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main(out: str, steps: int, micro: int, overrides) -> None:
    from raystream.config import compose
    from raystream.data import build_stream
    from raystream.models import build_scenario
    from raystream.train.correlation import measure_model

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = compose(overrides)
        model = build_scenario(cfg.scenario, cfg.stream, seed=int(cfg.trainer.seed)).model
        stream = build_stream(cfg.data, cfg.stream, rank=rank, world_size=world)
        result = measure_model(model, cfg, stream, steps=steps, micro_batch=micro or None, rank=rank,
                               world_size=world)
        stream.close()
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
        else:
            assert result is None
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
