"""What a training checkpoint holds, and writing / reading it (one directory, written by rank 0).

    model.pt          the scenario model's state dict (no DDP prefix): what `scenario.backbone.init=<dir>` reads
    train_state.pt    optimizer (the orthogonal EMA included), the previous raw gradient `grad_cos_prev` needs
                      (`diagnostics`), RNG states, running sums of the in-stream metrics, evaluation results so far
    meta.json         next_step, total_steps, the stream's state_dict, the MLflow run id, world size, finished, and
                      the byte size of the two other files (written last: a checkpoint is complete when they match)

Everything is tensors and plain containers, so it loads with `torch.load(weights_only=True)`. `snapshot` takes the
content (copied to host memory, so training can go on) and `write` puts it straight into a directory on any pyarrow
filesystem (local, s3://), meta.json last (the trainer runs it on Ray Train's upload thread). A
write that fails for space raises `raystream.diskspace.DiskFull` naming the file, its size and the disk's free
space, the part written removed.

Which checkpoint a re-run resumes from is read from the storage itself (`latest`): Ray Train's own record of the
latest checkpoint lags behind what the workers have written (the controller takes one report per poll), so after
Ctrl-C or `kill` it can name a checkpoint two or more behind the newest complete one. Whichever names it, the
checkpoint a worker restores is verified first (`restorable`: every file there, at the size recorded at save): a
torn one (a node lost while writing, an upload cut short) is skipped with a warning naming it, for the newest
complete one; when none is complete, `CheckpointError` names them all. `prune` removes the
checkpoint directories Ray Train no longer keeps (those it never registered included), so `trainer.keep_checkpoints`
holds after a resume too.
"""

from __future__ import annotations

import json
import random
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Dict, Optional, Sequence, Tuple

import numpy as np
import pyarrow.fs as pafs
import torch

from raystream import diskspace
from raystream.uris import is_file, open_output, read_bytes, write_bytes

MODEL_FILE = "model.pt"
STATE_FILE = "train_state.pt"
META_FILE = "meta.json"
PREFIX = "checkpoint_"


def dir_name(next_step: int) -> str:
    """`checkpoint_00000120`: zero-padded so the latest sorts last."""
    return f"{PREFIX}{next_step:08d}"


def rng_state() -> Dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Snapshot:
    """A checkpoint's content, ready to write: the two state files' objects and meta.json (sizes added on write)."""

    model_state: Dict[str, torch.Tensor]
    train_state: Dict[str, Any]  # the RNG states included
    meta: Dict[str, Any]


def host_copy(obj: Any) -> Any:
    """`obj` with every tensor copied to host memory (a CPU tensor cloned, since training goes on updating it in
    place), containers rebuilt: a snapshot a background thread can write while the next steps run."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [host_copy(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def snapshot(*, model_state: Dict[str, torch.Tensor], train_state: Dict[str, Any], meta: Dict[str, Any],
             copy: bool = True) -> Snapshot:
    """The checkpoint of the state now (RNG states taken here). `copy`: tensors copied to host memory (`host_copy`),
    for a write that runs while training goes on; without it the snapshot shares the live tensors."""
    train_state = {**train_state, "rng": rng_state()}
    if copy:
        model_state, train_state = host_copy(model_state), host_copy(train_state)
    return Snapshot(model_state, train_state, json.loads(json.dumps(meta)))


def write(fs, path: str, snap: Snapshot) -> None:
    """Write `snap` into checkpoint directory `path` on pyarrow filesystem `fs` (local or object store: straight
    there, no temporary copy). meta.json goes last, with the other files' sizes: until it is written the directory
    reads as torn (`restorable`), an older meta.json there (a checkpoint written again) removed first."""
    fs.create_dir(path, recursive=True)
    meta_path = f"{path}/{META_FILE}"
    if is_file(fs, meta_path):
        fs.delete_file(meta_path)
    sizes = {}
    local = isinstance(fs, pafs.LocalFileSystem)
    for name, obj in ((MODEL_FILE, snap.model_state), (STATE_FILE, snap.train_state)):
        try:
            if local:
                torch.save(obj, f"{path}/{name}")  # torch's own file writer: the fastest path to a local disk
            else:
                with open_output(fs, f"{path}/{name}") as f:
                    torch.save(obj, f)
        except (OSError, RuntimeError) as exc:
            if not diskspace.is_full(exc):
                raise
            _release_writer(exc)
            _remove(fs, f"{path}/{name}")  # the part written: space back for the record and the run's end
            raise diskspace.named(exc, f"{path}/{name}", diskspace.nbytes(obj), local) from None
        sizes[name] = fs.get_file_info(f"{path}/{name}").size
    write_bytes(fs, meta_path, json.dumps({**snap.meta, "file_sizes": sizes}, indent=1, sort_keys=True).encode())


def _release_writer(exc: BaseException) -> None:
    """Clear the frames of `exc`'s traceback and of those of the errors it followed: torch's zip writer, failed
    part way, holds its file open from them. Else the part written, unlinked, keeps its space for as long as the
    error lives, which DiskFull carries on (`__context__`): in a worker, in reference cycles until a garbage
    collection, so that the run's end (its record, the mirror's mark) found the disk still full."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__context__


def _remove(fs, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass


def save(directory: Path, *, model_state: Dict[str, torch.Tensor], train_state: Dict[str, Any],
         meta: Dict[str, Any]) -> Path:
    """Write a checkpoint of the live state into local `directory` now (no copy to host memory first)."""
    directory = Path(directory).resolve()
    write(pafs.LocalFileSystem(), str(directory),
          snapshot(model_state=model_state, train_state=train_state, meta=meta, copy=False))
    return directory


def load(directory: Path, map_location: Optional[torch.device] = None
         ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any], Dict[str, Any]]:
    """(model state dict, train state, meta) of a checkpoint directory."""
    directory = Path(directory)
    missing = [f for f in (MODEL_FILE, STATE_FILE, META_FILE) if not (directory / f).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {directory} lacks {', '.join(missing)}")
    try:
        model_state = torch.load(directory / MODEL_FILE, map_location=map_location or "cpu", weights_only=True)
        train_state = torch.load(directory / STATE_FILE, map_location=map_location or "cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError) as exc:  # torch's "PytorchStreamReader failed reading zip archive"
        raise CheckpointError(f"checkpoint {directory} cannot be read: {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0]}") from None
    meta = json.loads((directory / META_FILE).read_text())
    return model_state, train_state, meta


class CheckpointError(RuntimeError):
    """No checkpoint of a run can be resumed from (each one torn); the message names them and why."""


def _meta_or_problem(fs, path: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """(meta.json, "") of checkpoint directory `path` on pyarrow filesystem `fs` when every file is there at the
    size recorded at save; else (None, what is wrong)."""
    try:
        meta = json.loads(read_bytes(fs, f"{path}/{META_FILE}").decode())
    except (OSError, ValueError) as exc:  # missing, or cut short by a kill during the upload
        return None, f"{META_FILE} missing or unreadable ({type(exc).__name__})"
    sizes = meta.get("file_sizes") or {MODEL_FILE: None, STATE_FILE: None}
    for name, size in sizes.items():
        info = fs.get_file_info(f"{path}/{name}")
        if info.type != pafs.FileType.File:
            return None, f"{name} missing"
        if size is not None and info.size != size:
            return None, f"{name} is {info.size} bytes, {size} were written"
    return meta, ""


def _complete_meta(fs, path: str) -> Optional[Dict[str, Any]]:
    """meta.json of checkpoint directory `path` on pyarrow filesystem `fs` when every file is there in full."""
    return _meta_or_problem(fs, path)[0]


def checkpoint_dirs(fs, run_dir: str) -> Dict[str, int]:
    """{path: next step} of the `checkpoint_<step>` directories in `run_dir` (none when it does not exist)."""
    if fs.get_file_info(run_dir).type != pafs.FileType.Directory:
        return {}
    out = {}
    for info in fs.get_file_info(pafs.FileSelector(run_dir)):
        name = info.base_name
        if info.type == pafs.FileType.Directory and name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
            out[info.path] = int(name[len(PREFIX):])
    return out


def newest_complete(fs, run_dir: str) -> Optional[str]:
    """Path of the complete checkpoint with the highest step in `run_dir`; None when it holds none (torn ones are
    passed over without a word: `latest` names them)."""
    for path, _ in sorted(checkpoint_dirs(fs, run_dir).items(), key=lambda item: -item[1]):
        if _complete_meta(fs, path) is not None:
            return path
    return None


def latest(fs, run_dir: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(path, meta) of the complete checkpoint with the highest step in `run_dir`; None when it holds none. Newer
    torn ones are skipped with a warning naming each; CheckpointError when every one is torn."""
    skipped = []
    for path, _ in sorted(checkpoint_dirs(fs, run_dir).items(), key=lambda item: -item[1]):
        meta, problem = _meta_or_problem(fs, path)
        if meta is not None:
            for bad, why in skipped:
                print(f"raystream: WARNING: skipping torn checkpoint {bad} ({why}); resuming from {path}",
                      file=sys.stderr, flush=True)
            return path, meta
        skipped.append((path, problem))
    if skipped:
        raise CheckpointError(
            f"no checkpoint of {run_dir} can be resumed from: "
            + "; ".join(f"{bad} ({why})" for bad, why in skipped)
            + ". Remove them to start the run over, or start a new run under another trainer.run_name")
    return None


def restorable(candidates: Sequence[Any]):
    """The checkpoint a worker restores: the newest of `candidates` (Ray `Checkpoint`s: Ray Train's record of the
    latest and the driver's `resume_from`) when it is complete, else the newest complete one in its run directory
    (`latest`, naming what it skips). None without candidates; CheckpointError when none is complete."""
    from ray.train import Checkpoint  # lazy: checkpoints are written without Ray too (`raystream bench`)

    found = [c for c in candidates if c is not None]
    if not found:
        return None
    newest = max(found, key=lambda c: int(Path(c.path).name.removeprefix(PREFIX)))
    if _complete_meta(newest.filesystem, newest.path) is not None:
        return newest
    picked = latest(newest.filesystem, newest.path.rstrip("/").rsplit("/", 1)[0])
    if picked is None:  # the run directory itself is gone
        raise CheckpointError(f"checkpoint {newest.path}: {_meta_or_problem(newest.filesystem, newest.path)[1]}")

    return Checkpoint(picked[0], filesystem=newest.filesystem)


def prune(fs, run_dir: str, keep: Collection[str]) -> list:
    """Delete the checkpoint directories of `run_dir` whose name (`checkpoint_<step>`) is not in `keep`; returns
    the deleted paths."""
    gone = [path for path in checkpoint_dirs(fs, run_dir) if path.rstrip("/").rsplit("/", 1)[-1] not in keep]
    for path in gone:
        fs.delete_dir(path)
    return gone
