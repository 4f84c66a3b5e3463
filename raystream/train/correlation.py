"""The paper's Figure 1 as a pre-flight diagnostic: how parallel are consecutive batches' gradients in this stream?

    raystream data correlation [overrides] [--checkpoint PATH] [--steps N] [--device D] [--micro-batch M]
    -> {"sequential": 0.93, "shuffled": 0.01, "order": "batch_along_time", "pairs": 8, ...}

At fixed weights (the scenario's initial weights, or a checkpoint) the gradient of the loss is taken on `N` pairs of
consecutive global batches (t, t+1), the pairs spread evenly over one pass of the stream, once in the configured
order and once in the shuffled order of the same clips. The pass's mean gradient (estimated by the mean of all those
gradients, both orders pooled) is removed from each, and the cosine of each pair is averaged per order: the part of
cos(g_t, g_{t-1}) that comes from the order of the clips, not from the direction every batch shares. The raw
cosines (mean not removed, what `grad_cos_prev` logs during training) are reported too.

Where it runs: a training run measures it in its Ray Train workers, on their device, before step 0 of a fresh run
(`measure_model`, called by raystream/train/loop.py; rank 0 logs the figures at step 0). Each of `world_size` ranks
takes the gradient of its own shard of every measured global batch (the training stream's sharding), in
micro-batches of at most `micro_batch` clips whose losses are weighted by their share of the global batch; the
ranks' gradients are summed (all-reduce), so the figure is the single-process one. The standalone command is the
same code at world size 1: its memory is one micro-batch's, whatever the global batch.

Buffers (DoRA's centre) are restored after every micro-batch and no optimizer step is taken, so every gradient is
taken at the same point. The forward passes run under the run's autocast (`autocast_for(cfg.trainer, device)`, as
the training step: bf16 where the run trains in bf16), so a micro-batch of the per-worker batch holds what a
training step's forward holds. Memory and time: with one pair per order (`steps` 1) the four gradients are taken
once and held (`SINGLE_PASS_HELD`): their Gram matrix gives the raw and the centred cosines (16 bytes per parameter
on rank 0). With more pairs, two passes over the measured batches (each gradient taken twice): the first sums the
gradients (for the mean) and takes the raw cosines, the second removes the mean from each pair and takes the centred
cosines, holding at most three flattened fp32 gradients (the sum or mean, and one pair) whatever `steps`: 12 bytes
per parameter. With the weights and the gradient being taken, both stay under the 32 of a training step's weights,
gradient and Orthogonal-AdamW state with its diagnostics (cluster/gpu_memory.py), on the device the gradients are
taken on; other ranks hold one. Views and masks are functions of (seed, step, place), so the two orders see the same
augmentations at each step, and a micro-batch or shard sees what its places see in the whole batch. Pure torch on
the data / models / optim packages (torch.distributed when world_size > 1): no Ray.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable, ContextManager, Dict, List, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from raystream.data import ClipStream, DataError, build_stream, shard_places
from raystream.models import build_scenario
from raystream.optim.projection import cosine
from raystream.tracking.names import (CORRELATION_SEQUENTIAL as SEQUENTIAL, CORRELATION_SEQUENTIAL_RAW as
                                      SEQUENTIAL_RAW, CORRELATION_SHUFFLED as SHUFFLED, CORRELATION_SHUFFLED_RAW as
                                      SHUFFLED_RAW)
from raystream.train.model_uri import fetched
from raystream.train.step import autocast_for

# Gradients rank 0 may hold to take each one once: one pair per order (trainer.correlation_steps 1, as the CPU
# rehearsal and `raystream bench` measure) is measured in one pass holding 4 (16 bytes per parameter); more pairs
# take two passes holding 3, each gradient taken twice (the forward and backward passes are what the measurement
# costs).
SINGLE_PASS_HELD = 4
METRICS = {SEQUENTIAL: "sequential", SHUFFLED: "shuffled", SEQUENTIAL_RAW: "sequential_raw",
           SHUFFLED_RAW: "shuffled_raw"}  # MLflow metric -> key of the measurement


def pair_starts(num_steps: int, pairs: int) -> List[int]:
    """First steps t of `pairs` pairs (t, t+1) spread evenly over `num_steps` steps (fewer when the stream is short)."""
    if num_steps < 2:
        return []
    last = num_steps - 2
    if pairs <= 1:
        return [0]
    return sorted({round(i * last / (pairs - 1)) for i in range(pairs)})


def micro_places(batch_size: int, world_size: int, rank: int, micro_batch: Optional[int] = None) -> List[range]:
    """The places of the global batch that rank `rank` of `world_size` holds (its training shard), cut into
    micro-batches of at most `micro_batch` places (None: the whole shard; larger than the shard: the shard)."""
    shard = shard_places(int(batch_size), int(world_size), int(rank))
    m = len(shard) if micro_batch is None else min(int(micro_batch), len(shard))
    if m < 1:
        raise ValueError(f"micro-batch {micro_batch}: expected at least 1 clip")
    return [shard[i:i + m] for i in range(0, len(shard), m)]


def per_worker_batch(cfg) -> int:
    """The micro-batch of the measurement: `trainer.correlation_micro_batch`, else the training batch of one worker
    (`stream.batch_size // trainer.num_workers`)."""
    chosen = cfg.trainer.get("correlation_micro_batch")
    return int(chosen) if chosen is not None else int(cfg.stream.batch_size) // int(cfg.trainer.num_workers)


class _Shard:
    """This rank's micro-batch streams of one order, over the videos an already built stream probed."""

    def __init__(self, base, data_cfg, stream_cfg, rank: int, world_size: int, micro_batch: Optional[int]):
        places = micro_places(int(stream_cfg.batch_size), world_size, rank, micro_batch)
        self.streams = [ClipStream(base.videos, stream_cfg, data_cfg, p, rank, skipped=base.skipped) for p in places]
        self.batch_size = int(stream_cfg.batch_size)
        self.steps_per_pass = self.streams[0].order.steps_per_pass

    def micro_batches(self, step: int):
        """Each micro-batch of global batch `step` on this rank, decoded one at a time."""
        for stream in self.streams:
            batches = stream.batches(start_step=step)
            try:
                yield next(batches)
            finally:
                batches.close()

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


def _gradient(model: torch.nn.Module, params: List[torch.Tensor], state, shard: _Shard, step: int,
              device: Optional[torch.device], world_size: int, keep: bool,
              autocast: Callable[[], ContextManager]) -> Optional[torch.Tensor]:
    """The flattened fp32 gradient of the loss on global batch `step` (zeros for parameters the loss does not
    reach), summed over the ranks, on the parameters' device when `keep` (rank 0), else None. The forward passes run
    under `autocast`; the model's buffers are reset to `state` after every micro-batch. Raises ValueError on every
    rank alike when a rank's loss is not finite."""
    for p in params:
        p.grad = None
    bad = math.nan
    for batch in shard.micro_batches(step):
        with autocast():
            loss = model(batch.model_inputs(device))["loss"]
        n = int(batch.frames.shape[0])
        value = float(loss.detach())
        if not math.isfinite(value):
            bad = value
        # the mean loss of the global batch is the sum of its micro-batches' means weighted by their share
        (loss if n == shard.batch_size else loss * (n / shard.batch_size)).backward()
        _restore(model, state)
    flat = _flatten_grads(params)
    flat[-1] = 0.0 if math.isnan(bad) else 1.0
    if world_size > 1:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    if float(flat[-1]) > 0:
        where = f"is {bad}" if not math.isnan(bad) else "is not finite on another rank"
        raise ValueError(f"the loss at step {step} {where}: no gradient to correlate")
    return flat[:-1] if keep else None


def _flatten_grads(params: List[torch.Tensor]) -> torch.Tensor:
    """The parameters' gradients as one fp32 vector (zeros where None) with one spare element at the end; each
    `.grad` is dropped as soon as it is copied, so the gradient is never held twice."""
    flat = torch.zeros(sum(p.numel() for p in params) + 1, dtype=torch.float32, device=params[0].device)
    at = 0
    for p in params:
        if p.grad is not None:
            flat[at:at + p.numel()] = p.grad.reshape(-1)
        p.grad = None
        at += p.numel()
    return flat


def _buffers(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Copies of the model's buffers: what a forward pass may change (DoRA's centre); the parameters only change
    in an optimizer step, which the measurement never takes, so they are not copied (one model's memory less)."""
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def _restore(model: torch.nn.Module, buffers: Dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])


def _pair_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(cosine(torch.dot(a, b), torch.dot(a, a), torch.dot(b, b)))


def _mean_of_finite(values: List[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


class _Pairs:
    """The pairs (t, t+1) of one order: their first steps over this rank's shard of that order."""

    def __init__(self, shard: _Shard, stream_cfg, pairs: int):
        self.shard = shard
        self.starts = pair_starts(shard.steps_per_pass, pairs)
        if not self.starts:
            raise ValueError(f"stream.order = {stream_cfg.order}: one pass holds {shard.steps_per_pass} global "
                             f"batch(es) of stream.batch_size = {stream_cfg.batch_size}; consecutive batches need at "
                             "least 2")


def _gram64(vectors: List[torch.Tensor], chunk: int = 1 << 21) -> torch.Tensor:
    """The Gram matrix of `vectors` (of one length) summed in float64, a slice of every vector at a time in one
    float64 buffer of `chunk` elements, reused: no float64 copy of a whole gradient, each element converted once
    (not once per pair it is in) and no fresh memory per slice (with glibc's mmap threshold low, each fresh 8 MB
    float64 slice was a page-faulted, zeroed mapping)."""
    k, n = len(vectors), vectors[0].numel()
    width = max(1, chunk // k)
    buffer = torch.empty(k, min(width, n), dtype=torch.float64, device=vectors[0].device)
    gram = torch.zeros(k, k, dtype=torch.float64, device=vectors[0].device)
    for at in range(0, n, width):
        m = min(width, n - at)
        rows = buffer[:, :m]
        for i, v in enumerate(vectors):
            rows[i].copy_(v[at:at + m])
        for i in range(k):
            for j in range(i, k):
                gram[i, j] += torch.dot(rows[i], rows[j])
    return gram.triu() + gram.triu(1).T


def _cosines_once(orders: Dict[str, _Pairs], gradient: Callable[[_Shard, int], Optional[torch.Tensor]],
                  rank: int) -> Dict[str, Any]:
    """One pass, each gradient taken once and held on rank 0 (at most SINGLE_PASS_HELD of them): their Gram matrix
    G (float64) gives both figures, the centred ones by G_ab - r_a - r_b + s, r_i = m . g_i (G's row means) and
    s = m . m (G's mean), m the pooled mean of the K gradients."""
    held = []
    for key, pairs in orders.items():
        for t in pairs.starts:
            a = gradient(pairs.shard, t)
            b = gradient(pairs.shard, t + 1)
            if rank == 0:
                held.append((key, a, b))
    if rank != 0:
        return {}
    vectors = [v for _, a, b in held for v in (a, b)]
    gram = _gram64(vectors)
    row = gram.mean(dim=1)
    centred_gram = gram - row[:, None] - row[None, :] + gram.mean()
    raw: Dict[str, List[float]] = {key: [] for key in orders}
    centred: Dict[str, List[float]] = {key: [] for key in orders}
    for i, (key, _, _) in enumerate(held):  # clamped: the centring's rounding can step past +-1 (a pair = the mean's)
        a, b = 2 * i, 2 * i + 1
        raw[key].append(float(cosine(gram[a, b], gram[a, a], gram[b, b]).clamp(-1.0, 1.0)))
        centred[key].append(float(cosine(centred_gram[a, b], centred_gram[a, a], centred_gram[b, b]).clamp(-1.0, 1.0)))
    out: Dict[str, Any] = {key: _mean_of_finite(v) for key, v in centred.items()}
    out.update({f"{key}_raw": _mean_of_finite(v) for key, v in raw.items()})
    out["parameters"] = int(vectors[0].numel())
    return out


def _cosines(orders: Dict[str, _Pairs], gradient: Callable[[_Shard, int], Optional[torch.Tensor]],
             rank: int) -> Dict[str, Any]:
    """The figures, each gradient taken once when there are at most SINGLE_PASS_HELD of them (`_cosines_once`: one pair
    per order, as the rehearsal and `raystream bench` measure), else in two passes over the pairs: the raw mean pair
    cosine of each order and the sum of all the gradients, then, the pooled mean known, the same gradients taken
    again and the centred cosines. Rank 0 holds the sum (then the mean) and one pair; the other ranks take the same
    gradients (their all-reduces) and get {}."""
    if sum(2 * len(pairs.starts) for pairs in orders.values()) <= SINGLE_PASS_HELD:
        return _cosines_once(orders, gradient, rank)
    total: Optional[torch.Tensor] = None
    count = 0
    raw: Dict[str, List[float]] = {key: [] for key in orders}
    for key, pairs in orders.items():
        for t in pairs.starts:
            a = gradient(pairs.shard, t)
            b = gradient(pairs.shard, t + 1)
            if rank == 0:
                raw[key].append(_pair_cosine(a, b))
                total = a.add_(b) if total is None else total.add_(a).add_(b)
                count += 2
            del a, b
    mean = total.div_(count) if rank == 0 else None
    centred: Dict[str, List[float]] = {key: [] for key in orders}
    for key, pairs in orders.items():
        for t in pairs.starts:
            a = gradient(pairs.shard, t)
            if rank == 0:
                a.sub_(mean)
            b = gradient(pairs.shard, t + 1)
            if rank == 0:
                centred[key].append(_pair_cosine(a, b.sub_(mean)))
            del a, b
    if rank != 0:
        return {}
    out: Dict[str, Any] = {key: _mean_of_finite(v) for key, v in centred.items()}
    out.update({f"{key}_raw": _mean_of_finite(v) for key, v in raw.items()})
    out["parameters"] = int(mean.numel())
    return out


def measure_model(model: torch.nn.Module, cfg, base_stream, *, steps: int, device: Optional[torch.device] = None,
                  micro_batch: Optional[int] = None, rank: int = 0, world_size: int = 1,
                  weights: Optional[str] = None,
                  autocast: Optional[Callable[[], ContextManager]] = None) -> Optional[Dict[str, Any]]:
    """The measurement at `model`'s weights (in train mode, on `device`; restored as it was) on rank `rank` of
    `world_size` (a torch.distributed process group when > 1; every rank calls this, with the same arguments but
    its rank). `base_stream`: a ClipStream of `cfg.data` (its probed videos are reused). `autocast`: the training
    step's (raystream/train/step.py `autocast_for`); None: `autocast_for(cfg.trainer, device)`. Returns the figures
    on rank 0, None on the others. Raises ValueError on every rank alike (a stream too short, a non-finite loss)."""
    if steps < 1:
        raise ValueError(f"--steps {steps}: expected at least 1 pair of consecutive batches")
    if autocast is None:
        autocast = autocast_for(cfg.trainer, device or torch.device("cpu"))
    was_training = model.training
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    state = _buffers(model)
    # decoded inline, one micro-batch at a time: the pairs jump through the stream
    data_cfg = OmegaConf.merge(cfg.data, {"prefetch": 0, "read_ahead": False})
    order_cfgs = {"sequential": cfg.stream, "shuffled": OmegaConf.merge(cfg.stream, {"order": "shuffled"})}

    def gradient(shard: _Shard, step: int) -> Optional[torch.Tensor]:
        return _gradient(model, params, state, shard, step, device, world_size, rank == 0, autocast)

    shards: List[_Shard] = []
    try:
        orders = {}
        for key, stream_cfg in order_cfgs.items():
            shards.append(_Shard(base_stream, data_cfg, stream_cfg, rank, world_size, micro_batch))
            orders[key] = _Pairs(shards[-1], stream_cfg, steps)
        out: Dict[str, Any] = _cosines(orders, gradient, rank)
    finally:
        for shard in shards:
            shard.close()
        _restore(model, state)
        model.train(was_training)
    if rank != 0:
        return None
    seq = orders["sequential"]
    shard_size = int(cfg.stream.batch_size) // world_size
    out.update(order=str(cfg.stream.order), pairs=len(seq.starts), steps=seq.starts,
               steps_per_pass=seq.shard.steps_per_pass, scenario=str(cfg.scenario.name),
               batch_size=int(cfg.stream.batch_size), frames_per_clip=int(cfg.stream.frames_per_clip),
               fps=float(cfg.stream.fps), clip_shift=int(cfg.stream.clip_shift),
               resolution=int(cfg.stream.resolution), data=str(cfg.data.name), seed=int(cfg.trainer.seed),
               weights=str(weights if weights is not None else cfg.scenario.backbone.init),
               mean_removed="pooled mean of all measured gradients (both orders)",
               world_size=world_size, micro_batch=min(micro_batch or shard_size, shard_size),
               device=str(device or "cpu"), bf16=isinstance(autocast(), torch.autocast))
    return out


def measure(cfg, *, steps: int = 8, checkpoint: Optional[str] = None, device: Optional[str] = None,
            micro_batch: Optional[int] = None) -> Dict[str, Any]:
    """The measurement in this process (world size 1): the mean cosine of consecutive batches' gradients (pass
    mean removed) in the configured and shuffled orders.

    `cfg`: a composed run config (DictConfig). `steps`: pairs of consecutive batches per order. `checkpoint`: a
    model state dict, checkpoint or run directory (as `scenario.backbone.init`); None = the scenario's own init.
    `device`: a torch device ("cpu", "cuda", "cuda:1"; default cpu). `micro_batch`: clips per forward pass (memory
    is one micro-batch's); None = the whole global batch at once. The forward passes run under the run's autocast
    (`trainer.bf16`, null: bf16 on a GPU), as a training step's on that device.
    Raises DataError (videos), CheckpointError (checkpoint) or ValueError (a stream too short, a non-finite loss,
    a bad device or micro-batch).
    """
    if steps < 1:
        raise ValueError(f"--steps {steps}: expected at least 1 pair of consecutive batches")
    if micro_batch is not None and micro_batch < 1:
        raise ValueError(f"--micro-batch {micro_batch}: expected at least 1 clip")
    target = _device(device)
    scenario_cfg = cfg.scenario
    if checkpoint is not None:
        scenario_cfg = OmegaConf.merge(scenario_cfg, {"backbone": {"init": str(checkpoint)}})
    base = build_stream(cfg.data, cfg.stream)  # probes the videos once; never iterated
    try:
        model = build_scenario(fetched(scenario_cfg), cfg.stream, seed=int(cfg.trainer.seed)).model.to(target)
        return measure_model(model, cfg, base, steps=steps, device=target, micro_batch=micro_batch,
                             weights=str(checkpoint) if checkpoint is not None else None)
    finally:
        base.close()


def _device(name: Optional[str]) -> torch.device:
    """`--device` as a torch device, or ValueError naming it."""
    try:
        device = torch.device(name or "cpu")
    except RuntimeError as exc:
        raise ValueError(f"--device {name}: not a torch device ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this machine has no CUDA GPU (torch {torch.__version__}); use --device cpu")
    return device


def figures(result: Dict[str, Any]) -> Dict[str, float]:
    """The measurement's MLflow metrics (`correlation/*`), the finite ones."""
    return {name: float(result[k]) for name, k in METRICS.items() if math.isfinite(result[k])}


def main(cfg, *, steps: int = 8, checkpoint: Optional[str] = None, device: Optional[str] = None,
         micro_batch: Optional[int] = None) -> int:
    """`raystream data correlation`: print the measurement as one JSON line. Exit 0, or 2 (bad data, checkpoint,
    device, too short a stream). `micro_batch` None: the run's per-worker batch (`per_worker_batch`)."""
    torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)))
    try:
        result = measure(cfg, steps=steps, checkpoint=checkpoint, device=device,
                         micro_batch=micro_batch if micro_batch is not None else per_worker_batch(cfg))
    except (DataError, ValueError) as exc:  # CheckpointError is a ValueError
        print(f"raystream data correlation: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


def not_measured(exc: Exception) -> None:
    """A stream of one batch trains, but has no consecutive pair: said on stderr, not fatal."""
    print(f"raystream: stream correlation not measured: {exc}", file=sys.stderr, flush=True)

