"""The evaluations of a model on every rank of a Ray Train job: a training run's own (`eval.every`, the end) and
`raystream eval`'s run the same code.

Every rank calls `Evaluator(model)` at the same point: each extracts the features of its part of the probe set on its
device, the features are gathered, and the probes train data-parallel, so no rank sits in a collective (DDP's
all-reduce, the next report) while another probes, and a long probe trips no collective time-out. Held-out pixel error
(future prediction) is computed whole on every rank (a few batches).

`StoredFeatures` keeps the centre views' features of a checkpoint in a file (local or in a bucket), so a second
evaluation of the same weights under the same protocol encodes nothing.
"""

from __future__ import annotations

import contextlib
import io
import random
import sys
import time
from typing import Any, Dict, Optional

import numpy as np
import torch

from raystream.data import build_heldout_stream
from raystream.eval.loaders import load_probe_source
from raystream.eval.shard import Shard
from raystream.tracking import names
from raystream.uris import filesystem_at, read_file, write_bytes


@contextlib.contextmanager
def rng_kept():
    """Python's, numpy's and torch's (CPU and current GPU) random states are as they were after the block."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


class Evaluator:
    """One rank's evaluations: the probe set and held-out stream are loaded once, on first use. `cache`: where the
    probes' features are kept (None: extracted at each call, as in training, where the weights change); `hooks`:
    what a test injected (raystream/train/faults.py's `Faults`: its `eval_delay_s`, a long probe), or None."""

    def __init__(self, cfg, scenario, shard: Shard = Shard(), cache: Optional["StoredFeatures"] = None,
                 hooks: Optional[Any] = None):
        self.cfg, self.scenario, self.shard, self.cache = cfg, scenario, shard, cache
        self.delay_s = float(getattr(hooks, "eval_delay_s", 0.0))
        self._probe = None
        self._heldout = None

    def __call__(self, model) -> Dict[str, float]:
        needs = set(self.scenario.needs)
        probe = heldout = None
        if "probe" in needs and list(self.cfg.eval.metrics):
            if self._probe is None:
                self._probe = load_probe_source(self.cfg.data, self.cfg.stream, self.cfg.eval)
            probe = self._probe
        if "heldout" in needs and self.cfg.eval.heldout_batches > 0:
            if self._heldout is None:
                self._heldout = build_heldout_stream(self.cfg.data, self.cfg.stream)
            heldout = self._heldout.batches(0)
        if probe is None and heldout is None:
            return {}
        time.sleep(self.delay_s)
        # Evaluation must not move the training RNG streams (runs with and without evaluation stay identical).
        with rng_kept():
            out = self.scenario.evaluate(model, self.cfg.eval, probe=probe, heldout=heldout, shard=self.shard,
                                         cache=self.cache)
        return {names.eval_name(k): float(v) for k, v in out.items()}

    def close(self) -> None:
        if self._heldout is not None:
            self._heldout.close()


class StoredFeatures:
    """A FeatureCache in one file at `uri` (a local path or an object-store URI), written
    by rank 0 (to a temporary name, then moved into place). `extracted`: the samples this process's evaluation
    encoded for the file (0 when it reused it)."""

    def __init__(self, uri: str, rank: int):
        self.uri, self.rank, self.extracted = uri, rank, 0

    def _fs(self):
        return filesystem_at(self.uri)

    def load(self) -> Optional[Dict[str, Optional[torch.Tensor]]]:
        data = read_file(*self._fs())
        if data is None:
            return None
        try:
            found = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # torn or foreign: extract again (and overwrite it)
            print(f"raystream: stored features {self.uri} cannot be read ({type(exc).__name__}); extracting again",
                  file=sys.stderr, flush=True)
            return None
        print(f"raystream eval: features reused from {self.uri}", file=sys.stderr, flush=True)
        return found

    def save(self, features: Dict[str, Optional[torch.Tensor]], extracted: int) -> None:
        self.extracted = int(extracted)
        if self.rank != 0:
            return
        buffer = io.BytesIO()
        torch.save({k: (v.cpu() if v is not None else None) for k, v in features.items()}, buffer)
        fs, path = self._fs()
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        write_bytes(fs, f"{path}.tmp", buffer.getvalue())
        fs.move(f"{path}.tmp", path)
