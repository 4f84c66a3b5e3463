"""How rank 0's checkpoint reaches `trainer.storage_path`: written once, in place, while training goes on.

At a checkpoint, rank 0 copies the state to host memory (`checkpoint.snapshot`: all the step waits for) and hands it
to `ray.train.report(checkpoint_upload_mode=ASYNC, checkpoint_upload_fn=...)`. Ray Train's upload thread then
writes the files straight into the run's checkpoint directory (`checkpoint.write`, through Ray's own storage
filesystem: a local path or s3:// alike) and registers the checkpoint once they are complete, in report order.
There is no temporary copy. One write is in flight at most: the next checkpoint waits for it, so host memory holds
one copy of the state at most. A run on the CPU writing to a local disk is the exception: its state is in host
memory already, and `torch.save` from the live tensors into the page cache costs less than a copy into freshly
allocated memory (ViT-L, 6.1 GB: see docs/operations.md), so rank 0 writes in place and reports with
`checkpoint_upload_mode=NO_UPLOAD`, without the extra copy. A failed write fails the run (Ray Train raises it in the
training thread), and a write cut short leaves a directory without its meta.json, which a resume skips as torn. A
write in place that fails for space still reports (without its checkpoint), so that the other ranks waiting in the
report go on to `stop_for_space`, where all stop together.

Ray Train's record (its checkpoint manager, reloaded from `checkpoint_manager_snapshot.json` when a run is
re-run) can already hold the name of a checkpoint about to be written: one the stopped run had registered, found
torn on resume (`checkpoint.latest` resumes from an older one) and written again now. Registering the name a second
time would list the same directory twice; pruning the first entry (`trainer.keep_checkpoints`) deletes the
directory, and pruning the second then fails the run with `FileNotFoundError: Path not found`. Such a checkpoint
is therefore written in place before the report (the step waits for it, once) and reported without a checkpoint:
Ray's existing entry points at that directory, complete again. The checkpoint the run was restored from, reported
again by a run already at its end, is on storage in full and is not written again.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Collection, Dict, Optional

import pyarrow.fs as pafs
import ray.train
import ray.train.torch
import torch
import torch.distributed
from ray.train import Checkpoint, CheckpointConsistencyMode, CheckpointUploadMode

from raystream import diskspace
from raystream.train import checkpoint

_IDLE = threading.Event()  # no checkpoint write in flight in this process (one training attempt per worker process)
_IDLE.set()


def wait() -> None:
    """Until this process's checkpoint write in flight, if any, has ended (so every checkpoint reported so far is
    on storage in full)."""
    _IDLE.wait()


def registered_names() -> frozenset:
    """The checkpoint directory names Ray Train holds for this run (from earlier attempts); call it before the
    first report of an attempt (it waits for Ray to take every report already made)."""
    return frozenset(Path(c.checkpoint.path).name for c in
                     ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED))


class Checkpointer:
    """Rank 0's checkpoint reports of one attempt. `registered`: the names Ray Train already holds
    (`registered_names`); `restored`: the name of the checkpoint the attempt was restored from."""

    def __init__(self, registered: Collection[str] = (), restored: Optional[str] = None):
        self.registered = frozenset(registered)
        self.restored = restored

    def report(self, metrics: Dict[str, Any], name: str, take: Callable[[bool], checkpoint.Snapshot]) -> None:
        """`ray.train.report(metrics)` with checkpoint `name`, whose content `take(copy)` snapshots (after the
        previous write has ended; `copy`: into host memory, for a write while training goes on)."""
        storage = ray.train.get_context().get_storage()
        fs, path = storage.storage_filesystem, storage.build_checkpoint_path_from_name(name)
        if name in self.registered or name == self.restored or _in_place(fs):
            if name != self.restored:  # the restored checkpoint is on storage in full already
                wait()
                try:
                    checkpoint.write(fs, path, take(False))
                except diskspace.DiskFull:  # the other ranks wait in this report: release them, then fail together
                    ray.train.report(metrics, checkpoint=None, checkpoint_dir_name=name)
                    raise
            # a name Ray Train holds is reported without a checkpoint: its entry points at this directory already
            ray.train.report(metrics, checkpoint=None if name in self.registered else Checkpoint(path, filesystem=fs),
                             checkpoint_dir_name=name, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
            return
        wait()
        snap = take(True)
        _IDLE.clear()

        def upload(_checkpoint, _dir_name: str):
            try:
                checkpoint.write(fs, path, snap)
                return Checkpoint(path, filesystem=fs)
            finally:
                _IDLE.set()

        ray.train.report(metrics, checkpoint=Checkpoint(path, filesystem=fs), checkpoint_dir_name=name,
                         checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                         delete_local_checkpoint_after_upload=False, checkpoint_upload_fn=upload)


def stop_for_space(world: int, device: torch.device, full: Optional[diskspace.DiskFull]) -> bool:
    """Whether rank 0's disk filled (`full`, known on rank 0 only), agreed by every rank at the same point of the
    loop: all stop there together and the run fails once. A rank left waiting in a collective for a rank 0 that
    raised would fail the worker group, which Ray Train restarts (`trainer.max_failures`) only to fill the disk
    again."""
    if world == 1:
        return full is not None
    flag = torch.tensor([0 if full is None else 1], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def _in_place(fs) -> bool:
    """A CPU run writing to a local disk: written in place, synchronously, with no host copy first."""
    return isinstance(fs, pafs.LocalFileSystem) and ray.train.torch.get_device().type == "cpu"
