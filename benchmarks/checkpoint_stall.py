"""Claim (issue 34 item 4): a checkpoint stalls training only for the copy of the state to host memory.

    python benchmarks/checkpoint_stall.py [--experiment future_prediction_paper] [--dir /tmp/raystream-ckpt-bench]

Builds the paper experiment's model at the rehearsal's size (docs/paper-scale.md: its overrides, so ViT-L for
`future_prediction_paper`) and its optimizer exactly as training does (diagnostics on), fills the optimizer state
with one step on random gradients, then times rank 0's checkpoint both ways, on a local storage path under --dir:
    before   what the step waited for until issue 34: `torch.save` into a temporary directory, then Ray Train's
             synchronous upload copying it into the run's checkpoint directory (`pyarrow.fs.copy_files`)
    in place what the step waits for now on a CPU run with local storage: `checkpoint.write` of the live state
             straight into the checkpoint directory (Ray Train's NO_UPLOAD mode)
    async    what the step waits for now otherwise (a GPU run, or object storage): the copy of the state to host
             memory (`checkpoint.snapshot`); the write from that copy (`checkpoint.write`, in Ray Train's upload
             thread) is timed too, as the least time between two checkpoints with one write in flight at most
Each phase starts after `os.sync()`: dirty page cache left by the previous write slows the next allocation (a
host copy measured right after the old path's 12 GB of writes took 37 s instead of about 4). Each file written is
removed at the end (a ViT-L checkpoint is 6.1 GB; --dir needs about twice that free).
Imports torch and raystream (no Ray cluster); runs on the CPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from raystream.config import compose  # noqa: E402
from raystream.models import build_scenario  # noqa: E402
from raystream.optim import build_optimizer, param_groups  # noqa: E402
from raystream.train import checkpoint  # noqa: E402


def rehearsal_overrides() -> list:
    text = (ROOT / "docs" / "paper-scale.md").read_text()
    line = re.search(r'^REHEARSAL="([^"]+)"', text, re.M).group(1)
    return [o for o in shlex.split(line) if not o.startswith(("trainer.storage_path=", "mlflow.tracking_uri="))]


def state_of(experiment: str):
    """(model, optimizer) of `experiment` at the rehearsal's size, the optimizer state filled by one step."""
    cfg = compose([f"+experiment={experiment}", *rehearsal_overrides()])
    model = build_scenario(cfg.scenario, cfg.stream, seed=0).model
    groups = param_groups(model, cfg.optimizer)
    optimizer = build_optimizer(groups, cfg.optimizer, diagnostics=True)
    for group in groups:
        for p in group["params"]:
            p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    return model, optimizer


def gigabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="future_prediction_paper")
    parser.add_argument("--dir", default=tempfile.gettempdir() + "/raystream-ckpt-bench")
    args = parser.parse_args()
    import pyarrow.fs as pafs

    model, optimizer = state_of(args.experiment)
    n = sum(p.numel() for p in model.parameters())
    meta = {"next_step": 1, "total_steps": 2, "stream": {}, "world_size": 1}
    train_state = lambda: {"optimizer": optimizer.state_dict(), "diagnostics": optimizer.diagnostics_state_dict()}
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    fs = pafs.LocalFileSystem()
    try:
        os.sync()  # each phase starts with no dirty page cache to write back (it would slow the next allocation)
        t0 = time.perf_counter()
        tmp = checkpoint.save(root / "tmp", model_state=model.state_dict(), train_state=train_state(), meta=meta)
        t1 = time.perf_counter()
        dest = str(root / "before" / checkpoint.dir_name(1))
        fs.create_dir(dest)  # as Ray Train's StorageContext.persist_current_checkpoint does
        pafs.copy_files(str(tmp), dest, source_filesystem=fs, destination_filesystem=fs, chunk_size=64 * 2 ** 20)
        t2 = time.perf_counter()
        shutil.rmtree(tmp)
        size = gigabytes(root / "before")
        shutil.rmtree(root / "before")

        os.sync()
        t3 = time.perf_counter()
        checkpoint.write(fs, str(root / "in_place" / checkpoint.dir_name(1)),
                         checkpoint.snapshot(model_state=model.state_dict(), train_state=train_state(), meta=meta,
                                             copy=False))
        t4 = time.perf_counter()
        shutil.rmtree(root / "in_place")

        os.sync()
        t5 = time.perf_counter()
        snap = checkpoint.snapshot(model_state=model.state_dict(), train_state=train_state(), meta=meta)
        t6 = time.perf_counter()
        checkpoint.write(fs, str(root / "async" / checkpoint.dir_name(1)), snap)
        t7 = time.perf_counter()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.experiment} at the rehearsal's size: {n / 1e6:.0f} M parameters, checkpoint {size:.2f} GB, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"before:   stall {t2 - t0:6.1f} s  (torch.save to a temporary dir {t1 - t0:.1f} s + copy to storage "
          f"{t2 - t1:.1f} s)")
    print(f"in place: stall {t4 - t3:6.1f} s  (torch.save of the live state into the checkpoint directory)")
    print(f"async:    stall {t6 - t5:6.1f} s  (copy to host memory; then the write into storage, in the "
          f"background: {t7 - t6:.1f} s)")


if __name__ == "__main__":
    main()
