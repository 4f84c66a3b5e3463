"""The paper's Figure 1 as a pre-flight diagnostic: how parallel are consecutive batches' gradients in this stream?

    raystream data correlation [overrides] [--checkpoint PATH] [--steps N]
    -> {"sequential": 0.93, "shuffled": 0.01, "order": "batch_along_time", "pairs": 8, ...}

At fixed weights (the scenario's initial weights, or a checkpoint) the gradient of the loss is taken on `N` pairs of
consecutive global batches (t, t+1), the pairs spread evenly over one pass of the stream, once in the configured
order and once in the shuffled order of the same clips. The pass's mean gradient (estimated by the mean of all those
gradients, both orders pooled) is removed from each, and the cosine of each pair is averaged per order: the part of
cos(g_t, g_{t-1}) that comes from the order of the clips, not from the direction every batch shares. The raw
cosines (mean not removed, what `grad_cos_prev` logs during training) are reported too.

Weights and buffers (DoRA's centre) are restored after every batch, so every gradient is taken at the same point.
Views and masks are functions of (seed, step, place), so the two orders see the same augmentations at each step.
Pure torch on the data / models / optim packages: no Ray. `log_correlation` logs the figures to an MLflow run
(run start, `trainer.correlation_steps`).
"""

from __future__ import annotations

import copy
import math
import sys
import time
from typing import Any, Dict, List, Optional

import torch
from omegaconf import OmegaConf

from raystream.optim.reductions import cosine

from raystream.tracking.names import (CORRELATION_SEQUENTIAL as SEQUENTIAL, CORRELATION_SEQUENTIAL_RAW as
                                      SEQUENTIAL_RAW, CORRELATION_SHUFFLED as SHUFFLED, CORRELATION_SHUFFLED_RAW as
                                      SHUFFLED_RAW)


def pair_starts(num_steps: int, pairs: int) -> List[int]:
    """First steps t of `pairs` pairs (t, t+1) spread evenly over `num_steps` steps (fewer when the stream is short)."""
    if num_steps < 2:
        return []
    last = num_steps - 2
    if pairs <= 1:
        return [0]
    return sorted({round(i * last / (pairs - 1)) for i in range(pairs)})


def _gradient(model: torch.nn.Module, params: List[torch.Tensor], batch) -> torch.Tensor:
    """The flattened fp32 gradient of the loss on `batch` (zeros for parameters the loss does not reach)."""
    for p in params:
        p.grad = None
    out = model(batch.model_inputs())
    loss = out["loss"]
    if not torch.isfinite(loss):
        raise ValueError(f"the loss at step {batch.step} is {float(loss)}: no gradient to correlate")
    loss.backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])


def _order_gradients(model, params, state, data_cfg, stream_cfg, pairs: int) -> Dict[str, Any]:
    """Gradients of the pairs of consecutive batches of one order; the model is reset to `state` after each."""
    from raystream.data import build_stream

    stream = build_stream(data_cfg, stream_cfg)
    try:
        steps_per_pass = stream.order.steps_per_pass
        starts = pair_starts(steps_per_pass, pairs)
        if not starts:
            raise ValueError(f"stream.order = {stream_cfg.order}: one pass holds {steps_per_pass} global batch(es) "
                             f"of stream.batch_size = {stream_cfg.batch_size}; consecutive batches need at least 2")
        grads = []
        for t in starts:
            batches = stream.batches(start_step=t)
            for _ in range(2):
                grads.append(_gradient(model, params, next(batches)))
                model.load_state_dict(state)
            batches.close()
        return {"grads": grads, "starts": starts, "steps_per_pass": steps_per_pass}
    finally:
        stream.close()


def _mean_pair_cosine(grads: List[torch.Tensor], mean: Optional[torch.Tensor]) -> float:
    cos = []
    for a, b in zip(grads[0::2], grads[1::2]):
        if mean is not None:
            a, b = a - mean, b - mean
        c = float(cosine(torch.dot(a, b), torch.dot(a, a), torch.dot(b, b)))
        if math.isfinite(c):
            cos.append(c)
    return sum(cos) / len(cos) if cos else math.nan


def measure(cfg, *, steps: int = 8, checkpoint: Optional[str] = None) -> Dict[str, Any]:
    """The mean cosine of consecutive batches' gradients (pass mean removed) in the configured and shuffled orders.

    `cfg`: a composed run config (DictConfig). `steps`: pairs of consecutive batches per order. `checkpoint`: a
    model state dict, checkpoint or run directory (as `scenario.backbone.init`); None = the scenario's own init.
    Raises DataError (videos), CheckpointError (checkpoint) or ValueError (a stream too short, a non-finite loss).
    """
    from raystream.models import build_scenario

    if steps < 1:
        raise ValueError(f"--steps {steps}: expected at least 1 pair of consecutive batches")
    scenario_cfg = cfg.scenario
    if checkpoint is not None:
        scenario_cfg = OmegaConf.merge(scenario_cfg, {"backbone": {"init": str(checkpoint)}})
    seed = int(cfg.trainer.seed)
    scenario = build_scenario(scenario_cfg, cfg.stream, seed=seed)
    model = scenario.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    state = copy.deepcopy(model.state_dict())
    # decoded inline, one batch at a time: the pairs jump through the stream
    data_cfg = OmegaConf.merge(cfg.data, {"prefetch": 0, "read_ahead": False})
    configured = str(cfg.stream.order)
    orders = {"sequential": cfg.stream, "shuffled": OmegaConf.merge(cfg.stream, {"order": "shuffled"})}
    measured = {k: _order_gradients(model, params, state, data_cfg, s, steps) for k, s in orders.items()}
    pooled = [g for m in measured.values() for g in m["grads"]]
    mean = torch.stack(pooled).mean(0)
    out: Dict[str, Any] = {}
    for key, m in measured.items():
        out[key] = _mean_pair_cosine(m["grads"], mean)
    for key, m in measured.items():
        out[f"{key}_raw"] = _mean_pair_cosine(m["grads"], None)
    seq = measured["sequential"]
    out.update(order=configured, pairs=len(seq["starts"]), steps=seq["starts"],
               steps_per_pass=seq["steps_per_pass"], scenario=str(cfg.scenario.name),
               batch_size=int(cfg.stream.batch_size), frames_per_clip=int(cfg.stream.frames_per_clip),
               fps=float(cfg.stream.fps), clip_shift=int(cfg.stream.clip_shift),
               resolution=int(cfg.stream.resolution), data=str(cfg.data.name), seed=seed,
               weights=str(checkpoint) if checkpoint is not None else str(scenario_cfg.backbone.init),
               parameters=int(mean.numel()), mean_removed="pooled mean of all measured gradients (both orders)")
    return out


def log_correlation(mlflow_client, run_id: str, cfg) -> Dict[str, Any]:
    """Measure with `trainer.correlation_steps` pairs at the run's initial weights (on the driver, with
    `trainer.cpus_per_worker` torch threads) and log the four cosines as metrics at step 0 of the MLflow run `run_id`;
    returns the measurement ({} when the stream has no pair of consecutive batches: a warning on stderr)."""
    from mlflow.entities import Metric

    from raystream.tracking.store import retry

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)))
    try:
        result = measure(cfg, steps=int(cfg.trainer.correlation_steps))
    except ValueError as exc:  # a stream of one batch trains, but has no consecutive pair: said, not fatal
        print(f"raystream: stream correlation not measured: {exc}", file=sys.stderr)
        return {}
    finally:
        torch.set_num_threads(threads)
    now = int(time.time() * 1000)
    keys = {SEQUENTIAL: "sequential", SHUFFLED: "shuffled", SEQUENTIAL_RAW: "sequential_raw",
            SHUFFLED_RAW: "shuffled_raw"}
    metrics = [Metric(name, float(result[k]), now, 0) for name, k in keys.items() if math.isfinite(result[k])]
    retry(lambda: mlflow_client.log_batch(run_id, metrics=metrics), "log stream correlation")
    return result


def main(cfg, *, steps: int = 8, checkpoint: Optional[str] = None) -> int:
    """`raystream data correlation`: print the measurement as one JSON line. Exit 0, or 2 (bad data, checkpoint,
    too short a stream)."""
    import json

    from raystream.data import DataError

    torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)))
    try:
        result = measure(cfg, steps=steps, checkpoint=checkpoint)
    except (DataError, ValueError) as exc:  # CheckpointError is a ValueError
        print(f"raystream data correlation: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
