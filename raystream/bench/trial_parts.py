"""The parts of a trial that are not its steps, measured so that `raystream plan` can add them to a trial's time
(issue 68; raystream/tune/rates.py `outside_steps_s`): a small trial spends most of its wall time outside its steps
(a 10-trial sweep planned at 6.3 s from its steps alone took 353 s here).

    trial_parts_s: {process_start, build, correlation, evaluation, checkpoint}    seconds, each measured once

- process_start: a fresh Python process importing what a trial's worker imports (raystream's training loop: torch,
  Ray Train where it is installed, raystream). A trial on Ray Tune and Train starts 7 processes that each import Ray
  Train before its first step: the Tune trainable, the Train controller, its placement-group cleaner, queue,
  synchronization and dataset actors, and the worker(s); on a node of few cores (2 here, 2 trials at a time) they
  start one after another, so a plan counts PROCESS_CHAIN of them. Counting the trainable and the controller only
  (3 with the worker) planned a 4-trial sweep here at 42 s against its parent run's 125 s (2026-12-07, alone): the
  helper actors and Ray's scheduling between them were most of a small trial;
- build: the worker's model, optimizer and stream, as bench's Trainee builds them;
- correlation: the stream correlation a run measures before step 0, at the config's `trainer.correlation_steps`
  pairs (bench's correlation phase; 0 pairs: 0 s);
- evaluation: one evaluation as a run does it with one worker (raystream/train/evaluator.py), the first, which
  loads the probe set or the held-out stream;
- checkpoint: one checkpoint save as rank 0 writes it (bench's save, memory.py).
`trial_parts_not_measured` says why a part is missing (an evaluation whose data is not on this machine, Ray not
installed). Not measured: Ray's and MLflow's bookkeeping between those processes (a trial's records, Tune's polls).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from typing import Any, Dict, Tuple

from raystream.eval.shard import Shard
from raystream.train.evaluator import Evaluator

PROCESS_CHAIN = 7  # processes a trial starts, each importing Ray Train: trainable, controller, 4 helpers, worker
WORKER_IMPORT = "import raystream.train.loop"  # what a trial's worker process imports (torch, Ray Train, raystream)
WITHOUT_RAY = "import raystream.bench.trainee"  # the same less Ray, on a machine without Ray (a GPU node's bench)


@functools.lru_cache(maxsize=None)
def process_start() -> Tuple[float, str]:
    """(seconds a fresh Python process takes to import a worker's modules, what was imported or why not Ray).
    Measured once per process: it depends on the machine and what is installed, not on the config, and each
    measurement starts an interpreter that imports torch and Ray Train (seconds of CPU), which a campaign's presets
    (raystream/bench/campaign.py) would otherwise pay once each."""
    for code, note in ((WORKER_IMPORT, ""), (WITHOUT_RAY, "Ray is not installed: a worker's import less Ray's")):
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode == 0:
            return time.perf_counter() - began, note
        if "No module named 'ray" not in done.stderr:
            lines = done.stderr.strip().splitlines()
            return 0.0, f"a fresh process could not `{code}`: {lines[-1] if lines else done.returncode}"
    return 0.0, "a fresh process could not import raystream"


def evaluation(trainee) -> Tuple[float, str]:
    """(seconds of one evaluation of the trainee's model as a one-worker run does it, why it was not measured)."""
    evaluate = Evaluator(trainee.cfg, trainee.scenario, Shard())
    began = time.perf_counter()
    try:
        figures = evaluate(trainee.model)
    except (OSError, ValueError) as exc:  # the probe set or held-out videos not on this machine (DataError too)
        return 0.0, f"the evaluation could not run here: {exc}"
    finally:
        evaluate.close()
    seconds = time.perf_counter() - began
    return (seconds, "") if figures else (0.0, "the config evaluates nothing (no probe set, no held-out batches)")


def parts(trainee, build_s: float, correlation_s: float, checkpoint_s: float, seconds_left: float) -> Dict[str, Any]:
    """The JSON keys `trial_parts_s` and, where a part is missing, `trial_parts_not_measured` {part: why}; the
    evaluation only while the bench's time budget lasts (`seconds_left`)."""
    start_s, start_note = process_start()
    eval_s, eval_note = evaluation(trainee) if seconds_left > 0 else (0.0, "time budget spent")
    measured = {"process_start": start_s, "build": build_s, "correlation": correlation_s, "evaluation": eval_s,
                "checkpoint": checkpoint_s}
    missing = {k: v for k, v in (("process_start", start_note), ("evaluation", eval_note)) if v}
    return {"trial_parts_s": {k: round(v, 3) for k, v in measured.items()}, "trial_parts_not_measured": missing,
            "trial_process_chain": PROCESS_CHAIN}


__all__ = ["PROCESS_CHAIN", "parts", "process_start", "evaluation"]
