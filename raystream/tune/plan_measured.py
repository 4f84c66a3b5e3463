"""What the plan of a sweep learns from its MLflow experiment (issue 68): which of its trials finished already (the
sweep reuses them: they cost nothing), and each trial's wall time as the finished trials of the sweep ran it.

When a sweep is extended or resumed, the trials of it that finished give each trial's wall time as it ran (its
start, the stream correlation, evaluations and checkpoints included), which the rate of the training steps alone
leaves out (a 10-trial sweep planned at 6.3 s took 353 s).

`measure(planned, cfg, name)` reads the FINISHED trial runs of sweep `name` in the config's MLflow experiment (its
tracking store only when it exists: planning creates no store) and sets each cell's `trial_s` from them: a trial
of a cell of `s` steps takes the measured trials' wall times x s / their steps (low, median, high; their steps:
`steps_done`, else `trainer.max_steps`; when a trial's are unknown, each trial is taken to take a measured time).
Reused trials' links are not counted (they did not run here). No finished trial: the plan keeps the rate's time.

`reused_cells(the_plan, cfg)`: the cells the sweep would reuse, found as the sweep finds them
(raystream/tune/identity.py `find_reused`: a FINISHED trial of the same identity in the experiment).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, List, Optional, Sequence, Set, Tuple

from raystream.tracking import names
from raystream.tracking.store import tracking_uri
from raystream.tune.identity import REUSED_FROM_TAG, find_reused

SQLITE = "sqlite:///"


def _client(uri: str):
    """An MLflow client of the store at `uri`, or None when it is a sqlite file that does not exist (planning creates
    no store)."""
    if uri.startswith(SQLITE) and not Path(uri[len(SQLITE):]).exists():
        return None
    from mlflow.tracking import MlflowClient  # lazy: the plan reads MLflow only here

    return MlflowClient(uri)


def reused_cells(the_plan: Any, cfg) -> Set[int]:
    """Indexes of the sweep plan's cells that a FINISHED trial of the config's MLflow experiment ran already."""
    client = _client(tracking_uri(cfg))
    found = client.get_experiment_by_name(str(cfg.mlflow.experiment)) if client is not None else None
    return set() if found is None else set(find_reused(client, found.experiment_id, the_plan))


def finished_walls(uri: str, experiment: str, sweep: str) -> List[Tuple[float, float]]:
    """(steps, wall seconds) of each FINISHED trial of sweep `sweep` in `experiment`; [] when there is no store."""
    client = _client(uri)
    found = client.get_experiment_by_name(experiment) if client is not None else None
    if found is None:
        return []
    query = (f"tags.`{names.ROLE_TAG}` = '{names.ROLE_TRIAL}' and tags.`{names.SWEEP_TAG}` = '{sweep}' and "
             "attributes.status = 'FINISHED'")
    walls = []
    for run in client.search_runs([found.experiment_id], filter_string=query, max_results=5000):
        if REUSED_FROM_TAG in run.data.tags or not run.info.end_time:
            continue
        walls.append((_steps(run), (run.info.end_time - run.info.start_time) / 1000.0))
    return walls


def _steps(run) -> Optional[float]:
    """The steps a finished trial ran: its `steps_done` metric, else its trainer.max_steps; None when neither says
    (trainer.max_steps null: the stream's length)."""
    if run.data.metrics.get("steps_done"):
        return float(run.data.metrics["steps_done"])
    text = run.data.params.get("trainer.max_steps", "None")
    return float(text) if text.isdigit() and int(text) > 0 else None


def measure(planned: Sequence[Any], cfg, name: str) -> Optional[str]:
    """Set each CellPlan's `trial_s` from the finished trials of sweep `name`; the line saying so, or None (none
    finished: nothing changed)."""
    walls = finished_walls(tracking_uri(cfg), str(cfg.mlflow.experiment), name)
    if not walls:
        return None
    per_step = all(steps for steps, _ in walls)  # else each trial taken to run a cell's steps
    times = sorted(seconds / steps if per_step else seconds for steps, seconds in walls)
    low, mid, high = times[0], statistics.median(times), times[-1]
    for cp in planned:
        scale = cp.steps if per_step else 1.0
        cp.trial_s = {"low": low * scale, "estimate": mid * scale, "high": high * scale}
        cp.rate_note = ""
    return (f"nothing of a trial: its time is measured, the wall time of {len(walls)} finished trial"
            f"{'s' if len(walls) != 1 else ''} of sweep {name} (start, stream correlation, evaluations and "
            "checkpoints included)" + (" per step, x each cell's steps" if per_step else ""))
