"""`raystream plan train|sweep <overrides>`: what a run or a study will cost, before it is submitted.

For the same command line `raystream train` or `raystream sweep` takes, without starting Ray, building a model or
decoding a frame, it works out:

- the steps of each trial: `trainer.max_steps` capped at the stream's global steps, exactly as the run's driver
  counts them (`preflight.stream_plan`: the videos' frame counts from their index, `raystream data index`, or
  from probing each file's header; the demo videos are generated, once, as a run's driver does);
- the trials: one for `train`; the sweep file's grid cells x `num_samples` for `sweep` (`space.plan`);
- the trials the cluster holds at once: each trial's Train run holds `trainer.num_workers` x
  (`cpus_per_worker` CPUs [+ 1 GPU with `use_gpu`]) (`concurrency.trial_demand`), out of `--gpus` / `--cpus`, a
  cluster-launcher YAML's node types at their `max_workers` (`--cluster`, `capacity.max_resources`), or this
  machine; never more than `sweep.max_concurrent_trials` when that is set;
- each trial's time: its training steps at a measured rate, plus its parts outside the steps where the rate's
  bench measured them (start, correlation, evaluations, checkpoints: rates.py `outside_steps_s`); the rate from a
  `raystream bench --json` file of the user's node (`--rate-from`), else the shipped H200 figures of the paper
  presets (rates.py SHIPPED, from the campaign file raystream/bench/h200_campaign.json); then the sweep's wall
  time (the trials laid out on the concurrent slots in order), its GPU-hours and their cost at `--gpu-hour-price`.

The rate model. A bench measures steps/s at one per-worker batch b0 on one device, from batches held in memory and
from the live stream (decoding included). A trial of per-worker batch b (global batch / workers) is taken to run
each worker at the measured clips/s: the step less its optimizer step scales with b / b0, the optimizer step (the
bench's `optimizer_step_ms`, for the optimizer the cell runs where the bench timed it) does not. Data-parallel
workers are taken to add no time (their gradient all-reduce is not measured). The estimate is at the live rate;
the stated spread runs from the faster of the two rates divided by `spread` to the slower times `spread` (default
SPREAD: one node's rate from run to run, with a margin). A rate is used only for the setting it was measured in
(scenario, backbone preset, frames per clip, resolution, device, bf16); otherwise the plan says that no rate is known
and prints steps and trials alone. A trial's start, correlation, evaluations and checkpoints are in its time when
the bench file measured them (`trial_parts_s`; the shipped rates did not), or when finished trials of the sweep
give whole trials' wall times (plan_measured.py). Trials that finished already in the experiment with the same
identity are marked reused and left out of the totals, as the sweep reuses them. Not in the time: ASHA stopping
trials early, Ray's and MLflow's bookkeeping between a trial's processes.

Here: the arithmetic (steps, trials, concurrency, times, totals) and the command; the rates and the rate model in
rates.py; the printed text in plan_text.py.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml
from omegaconf import OmegaConf

from raystream.config import ConfigError
from raystream.config.sweep_study import seed_axis
from raystream.data import DataError
from raystream.train.capacity import max_resources
from raystream.train.preflight import machine_cpus, stream_plan
from raystream.tune.budget import check_plan
from raystream.tune.concurrency import trial_demand
from raystream.tune.plan_measured import measure, reused_cells
from raystream.tune.plan_text import text
from raystream.tune.rates import (SHIPPED, SPREAD, Rate, load_bench, optimizer_label, outside_steps_s, rate_for,
                                  step_seconds)
from raystream.tune.space import Cell, SweepPlan, plan as sweep_plan, structured

@dataclass
class CellPlan:
    """One grid cell (or the one run of `train`): its trials, steps and the time of each trial."""

    label: str
    trials: int
    steps: int
    limited_by: str  # "trainer.max_steps" or "the stream"
    global_batch: int
    workers: int
    demand: Dict[str, float]  # resources one trial's Train run holds
    evaluations: int
    checkpoints: int
    optimizer: str
    steps_per_s: Optional[Dict[str, float]] = None  # {"memory", "live"} at this cell's batch and optimizer
    trial_s: Optional[Dict[str, float]] = None  # {"low", "estimate", "high"}
    rate_note: str = ""
    no_rate: str = ""
    outside_steps_s: Optional[float] = None  # of trial_s: the trial's start, correlation, evaluations, checkpoints
    reused: int = 0  # of `trials`: finished already in the experiment (the sweep reuses them; not in the totals)


@dataclass
class Plan:
    kind: str  # "train" or "sweep"
    name: str
    overrides: List[str]
    trials: int
    cells: List[CellPlan]
    resources: Dict[str, float]
    resources_from: str
    concurrent_trials: int
    concurrency_note: str
    rate: Optional[Dict[str, Any]]
    spread: float
    wall_s: Optional[Dict[str, float]] = None
    gpu_hours: Optional[Dict[str, float]] = None
    gpu_hour_price: Optional[float] = None
    cost: Optional[Dict[str, float]] = None
    not_included: List[str] = field(default_factory=list)
    reused: int = 0  # trials finished already in the experiment, with the same identity: reused, not run
    seed_rounds: Optional[Dict[str, Any]] = None  # with sweep.seeds: trials and wall time at least / at most

    def as_json(self) -> Dict[str, Any]:
        return asdict(self)


def resources(gpus: Optional[int], cpus: Optional[float], cluster: Optional[str]) -> Tuple[Dict[str, float], str]:
    """(the resources trials can hold at once, where that figure comes from)."""
    if cluster is not None:
        return cluster_resources(cluster)
    if gpus is not None or cpus is not None:
        given = {"GPU": gpus, "CPU": cpus}
        return ({k: float(v) for k, v in given.items() if v is not None},
                ", ".join(f"--{k.lower()}s {v:g}" for k, v in given.items() if v is not None))
    import torch  # the data/model side of raystream imports it already

    return ({"CPU": float(machine_cpus()), "GPU": float(torch.cuda.device_count())},
            "this machine (give --gpus/--cpus or --cluster for another)")


def cluster_resources(path: str) -> Tuple[Dict[str, float], str]:
    """A cluster-launcher YAML (`ray up` format, e.g. cluster/aws.yaml) with every worker node type at its
    `max_workers`, at most the global `max_workers` nodes."""
    where = f"--cluster {path}"
    try:
        documents = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file (expected a Ray cluster-launcher YAML, e.g. cluster/aws.yaml)") \
            from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{where}: cannot be read as YAML ({str(exc).splitlines()[0]})") from None
    launcher = [d for d in documents if isinstance(d, dict) and isinstance(d.get("available_node_types"), dict)]
    config = launcher[0] if len(launcher) == 1 else None
    if config is None:
        raise ConfigError(f"{where}: no `available_node_types`: expected a Ray cluster-launcher YAML (`ray up` "
                          "format, e.g. cluster/aws.yaml); a KubeRay manifest's limits are not read, give --gpus")
    try:
        got = max_resources(config)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{where}: its node types cannot be read ({exc})") from None
    nodes = config.get("max_workers")
    return got, f"{where} (every worker node type at its max_workers" + \
        (f", {nodes} worker nodes at most)" if nodes is not None else ")")


def concurrency(cells: Sequence[Cell], trials: int, have: Mapping[str, float], have_from: str,
                explicit: Optional[int]) -> Tuple[int, str]:
    """(trials held at once, why): what the resources given hold of the most demanding cell, at most `explicit`
    (`sweep.max_concurrent_trials`) and the trials. ConfigError when one trial does not fit at all."""
    fits, why = trials, f"{trials} trial{'s' if trials != 1 else ''}"
    for cell in cells:
        for resource, amount in trial_demand(cell.config["trainer"]).items():
            if amount <= 0 or resource not in have:
                continue
            n = int(float(have[resource]) // amount)
            if n < 1:
                workers = cell.config["trainer"]["num_workers"]
                raise ConfigError(
                    f"a trial{' of cell ' + cell.label if cell.values else ''} holds {amount:g} {resource}s "
                    f"(trainer.num_workers = {workers}) but {have_from} has {have[resource]:g}: it could never "
                    "start; lower trainer.num_workers or give a larger cluster")
            if n < fits:
                fits, why = n, f"{have[resource]:g} {resource}s / {amount:g} per trial"
    if explicit and explicit < fits:
        fits, why = int(explicit), f"sweep.max_concurrent_trials = {explicit}"
    return fits, why


def layout(durations: Sequence[float], slots: int) -> float:
    """Wall time of trials started in order, each on the first slot free (as Tune starts queued trials)."""
    free = [0.0] * max(1, slots)
    for d in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + d)
    return max(free)


def _count(steps: int, every: int) -> int:
    """After how many of `steps` steps something done every `every` steps and after the last happens."""
    return 1 if every <= 0 else steps // every + (1 if steps % every else 0)


def _time(cp: CellPlan, rate: Rate, spread: float, order: str) -> None:
    """Fill in the cell's steps/s at its batch and optimizer, and its trials' time in their steps: the estimate at the
    live rate, the range from the faster rate / `spread` to the slower x `spread`."""
    b = cp.global_batch // cp.workers
    memory, cp.rate_note = step_seconds(rate, rate.memory_steps_per_s, b, cp.optimizer)
    if rate.order and order != rate.order:
        cp.rate_note = "; ".join(filter(None, [cp.rate_note, f"live rate read {rate.order}, this cell {order}: its "
                                                             "decoding may be slower"]))
    live = step_seconds(rate, rate.live_steps_per_s, b, cp.optimizer)[0] if rate.live_steps_per_s else memory
    cp.steps_per_s = {"memory": 1.0 / memory, "live": 1.0 / live}
    cp.outside_steps_s = outside_steps_s(rate, cp.evaluations, cp.checkpoints)
    extra = cp.outside_steps_s or 0.0
    cp.trial_s = {"low": (cp.steps * min(memory, live) + extra) / spread, "estimate": cp.steps * live + extra,
                  "high": (cp.steps * max(memory, live) + extra) * spread}


def _cells(kind: str, cfg, overrides: Sequence[str]) -> Tuple[str, List[Cell], int, Optional[SweepPlan]]:
    """(the name, the cells, the samples of each, the sweep's plan: None for `train`)."""
    if kind == "train":
        return "train", [Cell(index=0, values={}, config=OmegaConf.to_container(cfg, resolve=True))], 1, None
    the_plan: SweepPlan = sweep_plan(cfg, overrides)
    return the_plan.name, the_plan.cells, the_plan.num_samples, the_plan


def make_plan(kind: str, cfg, overrides: Sequence[str] = (), *, gpus: Optional[int] = None,
              cpus: Optional[float] = None, cluster: Optional[str] = None, rate_from: Optional[str] = None,
              gpu_hour_price: Optional[float] = None, spread: float = SPREAD) -> Plan:
    """The plan of `raystream <kind> <overrides>` (kind: train or sweep), `cfg` being its composed config."""
    if gpu_hour_price is not None and not (math.isfinite(gpu_hour_price) and gpu_hour_price >= 0):
        raise ConfigError(f"--gpu-hour-price {gpu_hour_price:g}: expected a price >= 0")
    if not (math.isfinite(spread) and spread >= 1):
        raise ConfigError(f"--spread {spread:g}: expected a factor >= 1")
    rates: Tuple[Rate, ...] = (load_bench(rate_from),) if rate_from else SHIPPED
    have, have_from = resources(gpus, cpus, cluster)  # bad files fail before any video is opened
    name, cells, samples, the_plan = _cells(kind, cfg, overrides)
    explicit = None if kind == "train" else cfg.sweep.max_concurrent_trials
    slots, why = concurrency(cells, len(cells) * samples, have, have_from, explicit)  # before any video is opened
    planned, used = _cell_plans(kind, name, cells, samples, rates, spread)
    measured = measure(planned, cfg, name) if kind == "sweep" else None  # finished trials of this sweep, if any
    for i in reused_cells(the_plan, cfg) if the_plan is not None else ():
        planned[i].reused = planned[i].trials
    result = Plan(kind=kind, name=name, overrides=list(overrides), trials=sum(cp.trials for cp in planned),
                  cells=planned, resources=have, resources_from=have_from, concurrent_trials=slots,
                  concurrency_note=why, rate=None if used is None else asdict(used), spread=spread,
                  gpu_hour_price=gpu_hour_price, not_included=_not_included(measured, planned),
                  reused=sum(cp.reused for cp in planned))
    if all(cp.trial_s is not None for cp in planned):
        _totals(result, samples)
    if kind == "sweep":
        result.seed_rounds = _seed_rounds(cfg.sweep, cells, planned, slots)
    return result


def _seed_rounds(sweep, cells: Sequence[Cell], planned: Sequence[CellPlan], slots: int) -> Optional[Dict[str, Any]]:
    """With seeds added while a comparison is open (`sweep.seeds`, raystream/tune/adaptive.py): the trials and wall
    time when every comparison is settled by the first round (`min` seeds a cell), against the totals (every seed up
    to `max`: the cells the plan lists, less the seeds past `max`). None without seed rounds."""
    seeds, key = sweep.get("seeds") or {}, seed_axis(sweep.grid)
    if seeds.get("min") is None or key is None:
        return None
    values = list(sweep.grid[key])
    first, most = values[:int(seeds["min"])], values[:int(seeds["max"])]
    def run(keep):
        return [cp for cell, cp in zip(cells, planned) if cell.values.get(key) in keep and not cp.reused]
    least, every = run(first), run(most)
    out: Dict[str, Any] = {"key": key, "min": int(seeds["min"]), "max": int(seeds["max"]),
                           "trials_at_least": len(least), "trials_at_most": len(every)}
    if all(cp.trial_s is not None for cp in every):
        out["wall_s_at_least"] = layout([cp.trial_s["estimate"] for cp in least], slots)
        out["wall_s_at_most"] = layout([cp.trial_s["estimate"] for cp in every], slots)
    return out


# What the time of a trial leaves out (printed under the plan, `not_included` in its JSON).
NOT_INCLUDED = (
    "each trial's start (Ray Train's workers, the model, the stream correlation) and the sweep's",
    "evaluations and checkpoints (counts per trial above; a `raystream bench --json` file of this setting measures "
    "them for --rate-from)",
    "trials an early-stopping scheduler (ASHA) ends before their last step",
    "data-parallel workers' gradient all-reduce (each worker taken to run at the measured clips/s)")
# With a bench file that measured a trial's parts outside its steps (raystream/bench/trial_parts.py), the first two
# are in the time; what is left of a trial's start:
OUTSIDE_MEASURED = ("Ray's and MLflow's bookkeeping between a trial's processes (its process starts, build, stream "
                    "correlation, evaluations and checkpoints are in the time, as the bench measured them)")


def _not_included(measured: Optional[str], planned: Sequence[CellPlan]) -> List[str]:
    """What the plan's time leaves out: nothing of a trial when finished trials measured it (`measured`, their
    line), else what the rate's bench did not measure."""
    if measured:
        return [measured]
    if planned and all(cp.outside_steps_s is not None for cp in planned):
        return [OUTSIDE_MEASURED, *NOT_INCLUDED[2:]]
    return list(NOT_INCLUDED)


def _cell_plans(kind: str, name: str, cells: Sequence[Cell], samples: int, rates: Sequence[Rate],
                spread: float) -> Tuple[List[CellPlan], Optional[Rate]]:
    """(each cell's plan, timed at its rate where one applies; the first rate used)."""
    steps_of: Dict[str, Tuple[int, str]] = {}
    planned: List[CellPlan] = []
    used: Optional[Rate] = None
    for cell in cells:
        c, t = cell.config, cell.config["trainer"]
        steps, limited_by = _steps(kind, name, cell, steps_of)
        cp = CellPlan(label=cell.label if kind == "sweep" else "", trials=samples, steps=steps, limited_by=limited_by,
                      global_batch=int(c["stream"]["batch_size"]), workers=int(t["num_workers"]),
                      demand=trial_demand(t), evaluations=_count(steps, int(c["eval"]["every"])),
                      checkpoints=_count(steps, int(t["checkpoint_every"])),
                      optimizer=optimizer_label(c["optimizer"], "cuda" if t["use_gpu"] else "cpu"))
        rate, cp.no_rate = rate_for(c, rates)
        if rate is not None:
            used = used or rate
            _time(cp, rate, spread, str(c["stream"]["order"]))
        planned.append(cp)
    return planned, used


def _steps(kind: str, name: str, cell: Cell, steps_of: Dict[str, Tuple[int, str]]) -> Tuple[int, str]:
    """(the cell's steps per trial, what limits them), each distinct stream opened once (`steps_of` remembers them),
    as the sweep's checks do."""
    c = cell.config
    key = json.dumps([c["data"], c["stream"], c["trainer"]["num_workers"], c["trainer"]["max_steps"]],
                     sort_keys=True, default=str)
    if key not in steps_of:
        try:
            steps, _ = stream_plan(structured(c))
        except (ConfigError, DataError) as exc:
            raise ConfigError(f"sweep `{name}`, cell {cell.label}: {exc}" if kind == "sweep" else str(exc)) from None
        capped = c["trainer"]["max_steps"] is not None and steps == int(c["trainer"]["max_steps"])
        steps_of[key] = (steps, "trainer.max_steps" if capped else "the stream")
    return steps_of[key]


def _totals(result: Plan, samples: int) -> None:
    """The sweep's wall time (its trials laid out on the concurrent slots in Tune's order: every cell, once per
    sample), its GPU-hours and, with a price, their cost; each as low, estimate and high."""
    planned = result.cells
    order = [cp for _ in range(samples) for cp in planned if not cp.reused]  # a reused trial does not run
    result.wall_s = {k: layout([cp.trial_s[k] for cp in order], result.concurrent_trials)
                     for k in ("low", "estimate", "high")}
    result.gpu_hours = {k: sum((cp.trials - cp.reused) * cp.trial_s[k] * cp.demand.get("GPU", 0.0)
                               for cp in planned) / 3600
                        for k in ("low", "estimate", "high")}
    if result.gpu_hour_price is not None:
        result.cost = {k: v * result.gpu_hour_price for k, v in result.gpu_hours.items()}


def main(kind: str, cfg, overrides: Sequence[str] = (), *, json_out: bool = False, **options: Any) -> int:
    """`raystream plan`: print the plan (or its JSON object with --json). Exit 0; bad input raises ConfigError."""
    p = make_plan(kind, copy.deepcopy(cfg), overrides, **options)
    print(json.dumps(p.as_json(), indent=1) if json_out else text(p), flush=True)
    if kind == "sweep":  # a budget the plan passes is refused as the sweep would refuse it (exit 2, after the plan)
        note = check_plan(cfg.sweep, p.cells, samples=int(cfg.sweep.num_samples))
        if note:
            print(f"raystream: {note}", file=sys.stderr)
    return 0


__all__ = ["Plan", "CellPlan", "make_plan", "resources", "concurrency", "layout", "main"]
