"""The probes on 2 ranks (raystream/eval/shard.py: real torch.distributed over gloo, 2 processes) give what one
process gives: kNN over test parts, the mini-batch linear probes and the attentive probe data-parallel, the
features gathered in the samples' order."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raystream.eval.attentive import attentive_probe_top1
from raystream.eval.knn import knn_top1
from raystream.eval.linear import dino_linear_top1, linear_probe_top1
from raystream.eval.shard import Shard


def data():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 16, generator=g) * 0.45
    y_train, y_test = torch.arange(40) % 4, torch.arange(22) % 4
    x_train = centres[y_train] + torch.randn(40, 16, generator=g)
    x_test = centres[y_test] + torch.randn(22, 16, generator=g)
    tokens = lambda x: x[:, None, :].repeat(1, 3, 1) + 0.1 * torch.randn(x.shape[0], 3, 16, generator=g)  # noqa
    return x_train, y_train, x_test, y_test, tokens(x_train), tokens(x_test)


def probes(shard: Shard):
    x, y, xt, yt, tok, tok_t = data()
    out = {"gathered": shard.gather(x[shard.rank::shard.world], x.shape[0])}
    out["knn"] = knn_top1(x, y, xt, yt, 4, k=5, shard=shard)
    out["sgd"] = linear_probe_top1(x, y, xt, yt, 4, optimizer="sgd", lr=0.05, batch_size=7, epochs=3, shard=shard)
    out["adamw"] = linear_probe_top1(x, y, xt, yt, 4, optimizer="adamw", batch_size=8, iterations=11, warmup=2,
                                     shard=shard)
    out["dino"] = dino_linear_top1(lambda idx: x[idx], y, xt, yt, 4, batch_size=9, epochs=2, warmup_epochs=1,
                                   shard=shard)
    out["attentive"] = attentive_probe_top1(tok, y, tok_t, yt, 4, epochs=2, batch_size=6, num_heads=2, shard=shard)
    return out


def _rank(rank: int, directory: str):
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        torch.save(probes(Shard.current()), f"{directory}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_give_what_one_process_gives(tmp_path):
    alone = probes(Shard())
    # Spawned ranks hand back their results in files: no fork of this process (a forked multiprocessing Manager
    # beside the session's live Ray driver left a later Ray Train run waiting forever for its controller).
    mp.spawn(_rank, args=(str(tmp_path),), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for out in ranks:
        assert torch.equal(out.pop("gathered"), data()[0])
        for key, value in out.items():  # the same accuracy (a few float additions in another order)
            assert abs(value - alone[key]) < 1e-9, (key, value, alone[key])
    assert all(0.25 < alone[k] < 1.0 for k in ("knn", "sgd", "adamw", "dino"))  # above chance, not trivial
