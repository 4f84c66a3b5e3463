"""What a sweep checks before Ray starts, for every cell together: the tracking store, and each cell's videos, probe
set, evaluation data and start checkpoint, each problem named once with the cells it concerns.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from raystream.config import ConfigError
from raystream.data import DataError
from raystream.tracking.store import TrackingStoreError, prepare_store
from raystream.train.preflight import check_backbone_init, input_problems, raise_together, total_steps
from raystream.tune.space import SweepPlan, structured


def store_problems(uri: str) -> List[str]:
    """The tracking store's problem (unreachable, not writable), or none; a new sqlite store is created here."""
    try:
        prepare_store(uri)
    except TrackingStoreError as exc:
        return [str(exc)]
    return []


def check_cells(the_plan: SweepPlan, problems: Optional[List[str]] = None) -> List[Optional[str]]:
    """Before Ray starts, what each trial's `fit` would find only after Ray started, for every cell together: its
    videos, probe set and evaluation data (`input_problems`), that the videos fill a global batch (each distinct
    data x stream x workers opened once; the demo videos are generated here), and that each distinct model's start
    checkpoint fits it. Returns each cell's start-checkpoint line (None for random weights), which its trials log
    without reading the file again. Each problem is named once with the cells it concerns and added to `problems`;
    without that list, they are raised together (a ConfigError)."""
    found: Dict[str, List[str]] = {}  # problem -> the cells it concerns
    seen = set()
    init_lines: Dict[str, Optional[str]] = {}
    for cell in the_plan.cells:
        c = cell.config
        key = json.dumps([c["data"], c["stream"], c["trainer"]["num_workers"], c["trainer"]["max_steps"],
                          c["scenario"]["name"], c["eval"]["dataset"]], sort_keys=True, default=str)
        cell_problems: List[str] = []
        init_key = _model_key(c)
        if init_key not in init_lines:  # each distinct model once: a checkpoint that does not fit it fails here
            try:
                init_lines[init_key] = check_backbone_init(structured(c))
            except ConfigError as exc:
                init_lines[init_key] = None
                cell_problems.append(str(exc))
        if key not in seen:
            seen.add(key)
            cfg = structured(c)
            inputs = input_problems(cfg, store=False)
            cell_problems += [p for p in inputs.values() if p not in cell_problems]
            try:
                if "data.videos" not in inputs:  # missing videos are named once, above
                    total_steps(cfg)
            except (ConfigError, DataError) as exc:
                cell_problems.append(str(exc))
        for problem in cell_problems:
            found.setdefault(problem, []).append(cell.label)
    named = [f"sweep `{the_plan.name}`, cell{'s' if len(cells) > 1 else ''} {', '.join(cells)}: {problem}"
             for problem, cells in found.items()]
    if problems is None:
        raise_together(named, f"sweep `{the_plan.name}`'s cells")
    else:
        problems += named
    return [init_lines[_model_key(c.config)] for c in the_plan.cells]


def _model_key(config: Dict[str, Any]) -> str:
    """What decides the model a cell builds, and so whether its start checkpoint fits it."""
    return json.dumps([config["scenario"], config["stream"]], sort_keys=True, default=str)
