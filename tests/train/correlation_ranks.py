"""One rank of the stream-correlation measurement in a real gloo process group (tests/train/test_correlation.py).

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python correlation_ranks.py OUT.json JOBS.json

JOBS.json: {name: {"steps": S, "micro": M, "overrides": [...]}}. For each job in turn, every rank builds the scenario
and its own shard's stream as a Ray Train worker would; rank 0 writes {name: figures}. The jobs share one process
group and one interpreter per rank (torch's import and the group's set-up, seconds of CPU, paid once).
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def measure(steps: int, micro: int, overrides, rank: int, world: int):
    """The figures of one job on this rank (None on the ranks other than 0)."""
    from raystream.config import compose
    from raystream.data import build_stream
    from raystream.models import build_scenario
    from raystream.train.correlation import measure_model

    cfg = compose(overrides)
    model = build_scenario(cfg.scenario, cfg.stream, seed=int(cfg.trainer.seed)).model
    stream = build_stream(cfg.data, cfg.stream, rank=rank, world_size=world)
    try:
        return measure_model(model, cfg, stream, steps=steps, micro_batch=micro or None, rank=rank,
                             world_size=world)
    finally:
        stream.close()


def main(out: str, jobs: dict) -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {name: measure(job["steps"], job["micro"], job["overrides"], rank, world)
                   for name, job in jobs.items()}
        if rank == 0:
            with open(out, "w") as f:
                json.dump(results, f)
        else:
            assert all(result is None for result in results.values())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        main(sys.argv[1], json.load(f))
