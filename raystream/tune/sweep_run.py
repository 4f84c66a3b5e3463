"""A sweep's MLflow parent run: the run its trials' child runs hang under, what a new one carries (tags, params,
its description and the columns of its view in the MLflow UI), and the one an earlier session opened when resumed.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from raystream import config_tree
from raystream.tracking import names, ui
from raystream.tracking.names import GRID_TAG_PREFIX, ROLE_TAG, SWEEP_RUN_TAG, SWEEP_TAG
from raystream.tracking.parent import ParentRecord, git_commit, open_parent
from raystream.config.sweep import GROUPS
from raystream.tune.space import SweepPlan


def parent_run(uri: str, experiment: str, run_name: str, cfg: DictConfig, the_plan: SweepPlan,
               meta: Optional[Dict[str, Any]]) -> str:
    """The sweep's MLflow parent run (`raystream.tracking.parent`): the one recorded beside the experiment when
    resuming, else a new one carrying `parent_record`."""
    return open_parent(uri, experiment, parent_record(cfg, the_plan, run_name),
                       resume_id=(meta or {}).get("parent_run_id"))


def parent_record(cfg: DictConfig, the_plan: SweepPlan, run_name: str) -> ParentRecord:
    """What a new parent run carries: the sweep's name, file, grid, sampled axes and the git commit, its params,
    the composed config, its cells and the columns of its view."""
    sweep = cfg.sweep
    grid = {k: [] for k in the_plan.grid_keys}  # the axes that run (a command-line override collapses one)
    for cell in the_plan.cells:
        for k, v in cell.values.items():
            if v not in grid[k]:
                grid[k].append(v)
    tags = {ROLE_TAG: names.ROLE_SWEEP, SWEEP_TAG: the_plan.name, SWEEP_RUN_TAG: run_name,
            names.GIT_COMMIT_TAG: git_commit(), names.GRID_TAG: json.dumps(grid),
            names.SAMPLE_TAG: json.dumps({k: sweep.sample[k] for k in the_plan.sample}),
            names.COMMAND_TAG: " ".join(["raystream", "sweep", *sys.argv[2:]]) if sys.argv[1:2] == ["sweep"]
            else "raystream.tune.sweep.run_sweep",
            names.NOTE_TAG: description(sweep.description or f"raystream sweep `{the_plan.name}`", the_plan, grid,
                                         {k: str(sweep.sample[k]) for k in the_plan.sample})}
    params = {"sweep.name": the_plan.name, "sweep.num_samples": the_plan.num_samples, "sweep.metric": sweep.metric,
              "sweep.mode": sweep.mode, "sweep.scheduler": sweep.scheduler, "sweep.trials": the_plan.num_trials,
              "sweep.cells": len(the_plan.cells)}
    params.update({f"sweep.grid.{k}": json.dumps(v) for k, v in grid.items()})
    params.update({f"sweep.sample.{k}": sweep.sample[k] for k in the_plan.sample})
    params.update({f"sweep.collapsed.{k}": v for k, v in the_plan.collapsed.items()})
    sweep_file = config_tree.find(f"sweep/{the_plan.name}.yaml")
    # a sweep given by overrides alone has no file; its composed config follows
    files = {"sweep": str(sweep_file)} if sweep_file is not None else {}
    return ParentRecord(run_name=run_name, tags=tags, params=params, view=view_columns(the_plan, [str(sweep.metric)]),
                        files=files, texts={"sweep/composed_config.yaml": OmegaConf.to_yaml(cfg)},
                        dicts={"sweep/cells.json": [{"cell": c.index, "values": c.values} for c in the_plan.cells]})


def description(text: str, the_plan: SweepPlan, grid: Dict[str, List[Any]], sample: Dict[str, str]) -> str:
    """The parent run's description in the MLflow UI (markdown): the sweep's own text, then its axes."""
    example = names.trial_run_name(the_plan.cells[0].values, {k: "…" for k in the_plan.sample}) \
        if the_plan.cells else "base"
    lines = [text, "", f"{the_plan.num_trials} trials, named by their grid values (e.g. `{example}`).", "",
             "Grid (every combination):"]
    lines += [f"- `{k}`: {', '.join(str(v) for v in values)}" for k, values in grid.items()] or ["- (none)"]
    if the_plan.sample:
        lines += ["", f"Sampled by Optuna, {the_plan.num_samples} per combination:"]
        lines += [f"- `{k}`: {spec}" for k, spec in sample.items()]
    if the_plan.collapsed:
        lines += ["", "Set on the command line: " + ", ".join(f"`{k}={v}`" for k, v in the_plan.collapsed.items())]
    return "\n".join(lines)


def view_columns(the_plan: SweepPlan, metrics: Sequence[str]) -> List[str]:
    """The columns of the sweep's view in the MLflow UI: each grid axis (a config key's param; for a config group
    axis such as `optimizer`, the `raystream.grid.<group>` tag), each sampled key, then `metrics`."""
    cols = [ui.column("tags", GRID_TAG_PREFIX + k) if k in GROUPS else ui.column("params", k)
            for k in the_plan.grid_keys]
    cols += [ui.column("params", k) for k in the_plan.sample]
    return cols + [ui.column("metrics", m) for m in dict.fromkeys(metrics)]
