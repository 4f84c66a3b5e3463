"""How many of raystream's files and functions one training step passes through, on the real loop (`train_steps`:
real model, optimizer, stream and MLflow; rank 0 of one worker built in-process without Ray, as in
test_step_syncs.py), counted with `sys.setprofile` from loading step k's batch to loading step k + 1's: a steady
step (no read-back) and a read-back step (the window read back, checked, recorded; no report, checkpoint or
evaluation falls on it). A reader holds one step in a few files: at most 16 on a steady step (21 on a read-back
step, which adds the record, the progress line, the finite check and the disk-space check: 2026-11-27; one more
each since Orthogonal-AdamW asks optim/triton_step.py whether its fused step runs here: 2026-11-28; three more
each since the 400-line limit split Orthogonal-AdamW's multi-tensor step and AdamW's kernels out of
optim/orthogonal_adamw.py and a batch's assembly out of data/stream/batches.py, one job a file, with one more
function in all: 2026-12-07).

    python -m pytest tests/train/test_step_files.py -s     # prints the files and the number of functions
"""

import collections
import itertools
import sys
from pathlib import Path

import pytest
import torch

from raystream.tracking import client as make_client
from raystream.train.loop import LoopState, Records, train_steps
from raystream.train.worker import Worker

LOG_EVERY = 4
PACKAGE = str(Path(__import__("raystream").__file__).parent) + "/"


def _count(w, records, k: int):
    """Train steps 0..k on the worker's stream; (calls per raystream file, functions) of loading and training step
    k (the step's own batch load and its loop body, up to the load of step k + 1)."""
    files: collections.Counter = collections.Counter()
    funcs = set()

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            short = frame.f_code.co_filename[len(PACKAGE):]
            files[short] += 1
            funcs.add((short, frame.f_code.co_name))

    def batches():
        source = iter(w.stream)
        for i in itertools.count():
            if i == k:
                sys.setprofile(prof)
            if i == k + 1:
                sys.setprofile(None)
                return
            yield next(source)

    try:
        assert train_steps(w, LoopState(), records, batches()) is None
    finally:
        sys.setprofile(None)
    return files, funcs


@pytest.mark.parametrize("k,kind,most", [(1, "steady", 16), (LOG_EVERY - 1, "read-back", 21)])
def test_one_step_passes_through_few_files(tiny, workdir, k, kind, most):
    client = make_client(workdir["mlflow"])
    exp = client.get_experiment_by_name("step-files") or client.get_experiment(client.create_experiment("step-files"))
    name = f"step-files-{k}"
    run = {"run_name": name, "total_steps": 1000, "tracking_uri": workdir["mlflow"],
           "mlflow_run_id": client.create_run(exp.experiment_id, run_name=name).info.run_id,
           "record": str(Path(workdir["storage"]) / name / "events.jsonl")}
    cfg = tiny(f"trainer.log_every={LOG_EVERY}", "trainer.report_every=1000", "trainer.checkpoint_every=1000",
               "eval.every=0")
    assert (cfg.scenario.name, cfg.optimizer.name) == ("videomae", "orthogonal_adamw")  # the defaults
    w = Worker.assemble(cfg, run, 0, 1, torch.device("cpu"), lambda model: model)
    records = Records(w, 0)
    try:
        files, funcs = _count(w, records, k)
    finally:
        records.close()
        w.stream.close()
    print(f"\n{kind} step {k}: {len(files)} files, {len(funcs)} functions")
    for short, calls in sorted(files.items()):
        print(f"  {short:40s} {calls:5d} calls  {sorted(f for s, f in funcs if s == short)}")
    assert len(files) <= most, sorted(files)
