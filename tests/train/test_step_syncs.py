"""The step loop reads device values back once per log window (raystream/train/step.py: `StepWindow`), counted
with the torch profiler on the real loop (`train_steps`: real model, optimizer, stream and MLflow; rank 0 of one
worker, built in-process without Ray, so no report falls in the profiled steps). A divergence is still named at its
exact step, whatever the window."""

import itertools
import math
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from raystream.tracking import client as make_client
from raystream.train.divergence import DivergedError
from raystream.train.loop import LoopState, Records, train_steps
from raystream.train.worker import Worker
from raystream.train.step import READ_BACK

# a host read of a tensor (float(), .item()), and a selection by boolean mask (on a GPU it reads its count back)
SYNCS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero")
OPTIMIZER = "Optimizer.step#"  # torch's label of every optimizer.step()
LOG_EVERY = 4


def _worker(tiny, workdir, name, *overrides, total=1000):
    """Rank 0 of one worker with its Records, logging into a fresh MLflow run; no report or checkpoint in
    `total` steps (every 1000)."""
    client = make_client(workdir["mlflow"])
    exp = client.get_experiment_by_name("sync-tests") or client.get_experiment(client.create_experiment("sync-tests"))
    run_id = client.create_run(exp.experiment_id, run_name=name).info.run_id
    cfg = tiny(f"trainer.log_every={LOG_EVERY}", "trainer.report_every=1000", "trainer.checkpoint_every=1000",
               *overrides)
    run = {"run_name": name, "total_steps": total, "tracking_uri": workdir["mlflow"], "mlflow_run_id": run_id,
           "record": str(Path(workdir["storage"]) / name / "events.jsonl")}
    w = Worker.assemble(cfg, run, 0, 1, torch.device("cpu"), lambda model: model)
    return w, Records(w, 0), client, run_id


def _history(client, run_id, key):
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def _outside(event, prefix) -> bool:
    while event is not None:
        if event.name.startswith(prefix):
            return False
        event = event.cpu_parent
    return True


@pytest.mark.parametrize("optimizer", ["orthogonal_adamw", "adamw"])
def test_two_log_windows_read_back_twice(tiny, workdir, optimizer):
    """2 x log_every steps: at most one host read per window beyond those the optimizer step makes itself (torch's
    AdamW reads its step counters back; its own count per step is measured here as the baseline). Every step's
    metrics still reach MLflow."""
    w, records, client, run_id = _worker(tiny, workdir, f"sync-{optimizer}", f"optimizer.name={optimizer}")
    steps = 2 * LOG_EVERY
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            assert train_steps(w, LoopState(), records, itertools.islice(w.stream, steps)) is None
    finally:
        records.close()
        w.stream.close()
    events = prof.events()
    top = [e for e in events if e.name in SYNCS and (e.cpu_parent is None or e.cpu_parent.name not in SYNCS)]
    optimizer_steps = [e for e in events if e.name.startswith(OPTIMIZER)]
    own = [e for e in top if not _outside(e, OPTIMIZER)]
    assert len(optimizer_steps) == steps  # the baseline is measured where torch labels the optimizer's step
    read_backs = [e for e in events if e.name == READ_BACK]
    outside = [e for e in top if _outside(e, OPTIMIZER)]
    print(f"{optimizer}: {len(own) / steps:.1f} host reads per optimizer step (baseline); loop: {len(read_backs)} "
          f"read-backs, {len(outside)} other reads in {steps} steps")
    assert len(read_backs) + len(outside) <= 2, [(e.name, e.cpu_parent and e.cpu_parent.name) for e in outside]
    assert len(read_backs) == 2
    history = {key: _history(client, run_id, key) for key in ("loss", "grad_norm", "grad_cos_prev", "lr")}
    counts = {key: len(values) for key, values in history.items()}
    assert counts == {"loss": steps, "grad_norm": steps, "grad_cos_prev": steps - 1, "lr": steps}  # NaN at step 0
    assert all(math.isfinite(v) for v in history["loss"] + history["grad_norm"])


def test_a_divergence_is_named_at_its_step_whatever_the_window(tiny, workdir):
    """lr 1e6: read back every step and every LOG_EVERY steps, the run stops naming the same step, and MLflow holds
    the same values of the steps before it (none after)."""
    found = []
    for log_every in (1, LOG_EVERY):
        w, records, client, run_id = _worker(tiny, workdir, f"diverge-{log_every}", "optimizer.lr=1e6",
                                             "optimizer.warmup_steps=0", f"trainer.log_every={log_every}")
        try:
            exc = train_steps(w, LoopState(), records, itertools.islice(w.stream, 12))
        finally:
            records.close()
            w.stream.close()
        assert isinstance(exc, DivergedError) and f"at step {exc.step}" in str(exc)
        found.append((exc.step, _history(client, run_id, "loss"), _history(client, run_id, "grad_norm")))
    (step, loss, norm), again = found
    assert 1 <= step < 8 and found[1] == found[0]
    assert len(loss) == len(norm) == step
