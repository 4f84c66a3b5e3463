"""The batching orders of the paper's Figure 4, as pure index arithmetic: which clip of which video sits at each
(step, place) of the global batch. No decoding here; `batches.py` turns these indices into frames.

Given the number of clips of every video (in stream order), global batch size B, seed and passes:

- `batch_along_time`: the videos are concatenated into one stream of clips; step t of a pass holds clips
  tB .. tB+B-1 of that stream (the last partial batch of a pass is dropped).
- `batch_along_video`: B slots. Each slot takes the next video from the queue and walks through its clips; step t
  holds the next clip of every slot, slot 0 first. A slot whose video ends takes the next video in the queue (lower
  slots first when several end together); the pass ends at the first step a slot finds the queue empty.
- `shuffled`: the IID baseline: all clips in a random permutation drawn from (seed, pass), batched.

Passes repeat the order (the shuffled one re-drawn). Sharding over W workers: worker r holds places
[r*B/W, (r+1)*B/W) of every global batch, so the global sequence is the same for any W.
"""

from __future__ import annotations

import heapq
from typing import Dict, List, Sequence, Tuple

import numpy as np

ORDERS = ("batch_along_time", "batch_along_video", "shuffled")


def check_shards(batch_size: int, world_size: int) -> None:
    """The one check that a global batch splits evenly over the training workers (ValueError naming both keys)."""
    if world_size < 1 or batch_size % world_size != 0:
        raise ValueError(f"stream.batch_size = {batch_size} is not divisible by the number of training workers "
                         f"(trainer.num_workers) = {world_size}: every worker holds an equal shard of each global "
                         "batch")


def shard_places(batch_size: int, world_size: int, rank: int) -> range:
    """The places of the global batch held by worker `rank` of `world_size`."""
    check_shards(batch_size, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank = {rank} is outside [0, {world_size})")
    b = batch_size // world_size
    return range(rank * b, (rank + 1) * b)


class Order:
    """(step, place) -> (video, clip) for one of `ORDERS`; `steps_per_pass * epochs` global steps."""

    def __init__(self, name: str, clips_per_video: Sequence[int], batch_size: int, seed: int = 0, epochs: int = 1):
        if name not in ORDERS:
            raise ValueError(f"stream.order = {name!r}: expected one of {', '.join(ORDERS)}")
        self.name = name
        self.counts = np.asarray(clips_per_video, dtype=np.int64)
        if (self.counts < 1).any():
            raise ValueError("every video of an order needs at least one clip")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epochs = int(epochs)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])  # first global clip id of each video
        self.total_clips = int(self.offsets[-1])
        self._perms: Dict[int, np.ndarray] = {}
        if self.along_video:
            self.steps_per_pass, self._slots = _slot_schedule(self.counts, self.batch_size)
        else:
            self.steps_per_pass = self.total_clips // self.batch_size

    @property
    def num_steps(self) -> int:
        return self.steps_per_pass * self.epochs

    @property
    def sequential(self) -> bool:
        """Clips of a video reach the batches in their order within a pass (both orders but `shuffled`)."""
        return self.name != "shuffled"

    @property
    def along_video(self) -> bool:
        """Each place walks through one video at a time (`batch_along_video`)."""
        return self.name == "batch_along_video"

    def clips_at(self, step: int, places: Sequence[int] | None = None) -> Tuple[np.ndarray, np.ndarray]:
        """(video index, clip index) arrays for `places` (default: all B) of global batch `step`."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} is outside the stream's {self.num_steps} steps")
        places = np.arange(self.batch_size) if places is None else np.asarray(list(places), dtype=np.int64)
        epoch, s = divmod(int(step), self.steps_per_pass)
        if self.along_video:
            videos = np.empty(len(places), dtype=np.int64)
            clips = np.empty(len(places), dtype=np.int64)
            for i, p in enumerate(places):
                starts, vids = self._slots[int(p)]
                j = int(np.searchsorted(starts, s, side="right")) - 1
                videos[i], clips[i] = vids[j], s - starts[j]
            return videos, clips
        ids = s * self.batch_size + places
        if not self.sequential:
            ids = self._permutation(epoch)[ids]
        videos = np.searchsorted(self.offsets, ids, side="right") - 1
        return videos, ids - self.offsets[videos]

    def _permutation(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s permutation, the last two kept. Safe from two threads at once (a stream's batches and
        its prefetcher, data/prefetch.py): the cache is replaced whole, never changed in place."""
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.total_clips)
            last = list(self._perms.items())[-1:]
            self._perms = {**dict(last), epoch: perm}
        return perm


def _slot_schedule(counts: np.ndarray, batch_size: int) -> Tuple[int, List[Tuple[np.ndarray, np.ndarray]]]:
    """Simulate batch_along_video: per slot, the steps at which it starts each of its videos; and the pass length."""
    free = [(0, slot) for slot in range(batch_size)]  # (step the slot needs a new video, slot)
    heapq.heapify(free)
    starts: List[List[int]] = [[] for _ in range(batch_size)]
    videos: List[List[int]] = [[] for _ in range(batch_size)]
    queue = 0
    while True:
        at, slot = heapq.heappop(free)
        if queue == len(counts):
            end = at
            break
        starts[slot].append(at)
        videos[slot].append(queue)
        heapq.heappush(free, (at + int(counts[queue]), slot))
        queue += 1
    slots = [(np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.int64)) for s, v in zip(starts, videos)]
    return end, slots
