"""Training steps per second fed from device memory and from the live stream, and the decode workers the live
stream needs.

From memory: the first batches of the stream (at most `HELD`) are decoded beforehand and kept on the device, and
the steps cycle through them: the device's own speed. Live: the worker's `DeviceStream` over the stream with a
given `data.decode_workers`, started fresh (its start-up is in the warm-up steps). Their ratio is the share of the
device's time the input pipeline lets it work. Every measurement trains the same model on: `warmup` untimed steps,
then `steps` timed ones (fewer when the time budget runs out, never fewer than one), between device
synchronisations.
"""

from __future__ import annotations

import gc
import itertools
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

from raystream.bench.trainee import BenchError, Budget, Trainee, build_device_stream, sync

HELD = 4  # batches kept on the device for the from-memory steps
TARGET = 0.9  # live / from-memory a decode-worker count must reach


@dataclass
class Rate:
    steps_per_s: float
    clips_per_s: float
    steps: int  # timed steps
    seconds: float  # the whole measurement, stream start-up and warm-up included
    warmup_s: float = 0.0  # the untimed steps (a compiled model compiles in the first)


def timed_steps(trainee: Trainee, batches: Iterable, warmup: int, steps: int, budget: Budget) -> Rate:
    """`warmup` untimed then up to `steps` timed training steps on `batches`."""
    began = time.perf_counter()
    source = iter(batches)
    done, t0, first = 0, None, None
    for i in range(warmup + steps):
        if i == warmup:
            sync(trainee.device)
            t0 = time.perf_counter()
        try:
            batch = next(source)
        except StopIteration:
            raise BenchError(f"the stream ended after {i} batches; {warmup + steps} were needed") from None
        first = first or time.perf_counter()
        trainee.step(batch)
        if i >= warmup:
            done += 1
            if budget.left() <= 0:
                break
    sync(trainee.device)
    seconds = time.perf_counter() - t0
    rate = done / seconds
    return Rate(rate, rate * trainee.batch_size, done, time.perf_counter() - began,
                max(0.0, t0 - first))


def from_memory(trainee: Trainee, warmup: int, steps: int, budget: Budget) -> Rate:
    stream = build_device_stream(trainee.cfg, trainee.device, min(HELD, warmup + steps))
    try:
        held = list(itertools.islice(iter(stream), min(HELD, warmup + steps)))
    finally:
        stream.close()
    rate = timed_steps(trainee, itertools.cycle(held), warmup, steps, budget)
    del held
    gc.collect()
    return rate


def live(trainee: Trainee, warmup: int, steps: int, budget: Budget, decode_workers: Optional[int] = None) -> Rate:
    """Steps from the live stream with `decode_workers` threads (None: the configured `data.decode_workers`)."""
    stream = build_device_stream(trainee.cfg, trainee.device, warmup + steps, decode_workers)
    try:
        return timed_steps(trainee, stream, warmup, steps, budget)
    finally:
        stream.close()


def worker_counts(cores: int) -> List[int]:
    """1, 2, 4, ... up to `cores`, and `cores` itself."""
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts + ([cores] if counts[-1] != cores else [])


@dataclass
class Sweep:
    rates: Dict[int, Rate]  # decode_workers -> live rate, in the order measured
    needed: Optional[int]  # the smallest measured count reaching TARGET x from-memory, None when none did
    decode_bound: bool  # every count up to the cores was measured and none reached TARGET
    not_measured: List[int]  # counts below `needed` (or any, when none reached) the time budget left out

    def verdict(self, memory: Rate) -> str:
        if self.needed is not None:
            fewer = f"; fewer ({self.not_measured}) not measured: time budget" if self.not_measured else ""
            return f"decode_workers={self.needed} reaches {TARGET}x of from-memory{fewer}"
        best = max(self.rates, key=lambda w: self.rates[w].steps_per_s) if self.rates else None
        best_text = (f"best {self.rates[best].steps_per_s / memory.steps_per_s:.2f}x with {best}"
                     if best is not None else "none measured")
        if self.decode_bound:
            return f"decode-bound: no decode_workers up to {max(self.rates)} reaches {TARGET}x ({best_text})"
        return f"undetermined: the time budget left decode_workers {self.not_measured} unmeasured ({best_text})"


def sweep_decode_workers(trainee: Trainee, memory: Rate, counts: List[int], warmup: int, steps: int, budget: Budget,
                         measured: Dict[int, Rate]) -> Sweep:
    """Live steps/s for each count of `counts` in turn until one reaches TARGET x `memory` (rates in `measured`
    are reused). A count is left out when the budget left is under 1.2x the longest live measurement so far."""
    rates: Dict[int, Rate] = {}
    skipped: List[int] = []
    for w in counts:
        if w not in measured:
            longest = max(r.seconds for r in [*measured.values(), *rates.values()]) if measured or rates else 0.0
            if budget.left() < 1.2 * longest:
                skipped.append(w)
                continue
        rates[w] = measured[w] if w in measured else live(trainee, warmup, steps, budget, w)
        if rates[w].steps_per_s >= TARGET * memory.steps_per_s:
            return Sweep(rates, w, False, skipped)
    return Sweep(rates, None, not skipped, skipped)
