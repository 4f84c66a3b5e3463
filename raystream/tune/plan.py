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
- each trial's time in its training steps, at a measured rate: a `raystream bench --json` file of the user's node
  (`--rate-from`), else the shipped H200 figures of the paper presets (SHIPPED); then the sweep's wall time (the
  trials laid out on the concurrent slots in order), its GPU-hours and their cost at `--gpu-hour-price`.

The rate model. A bench measures steps/s at one per-worker batch b0 on one device, from batches held in memory and
from the live stream (decoding included). A trial of per-worker batch b (global batch / workers) is taken to run
each worker at the measured clips/s: the step less its optimizer step scales with b / b0, the optimizer step (the
bench's `optimizer_step_ms`, for the optimizer the cell runs where the bench timed it) does not. Data-parallel
workers are taken to add no time (their gradient all-reduce is not measured). The estimate is at the live rate;
the stated spread runs from the faster of the two rates divided by `spread` to the slower times `spread` (default
SPREAD: one node's rate from run to run, with a margin). A rate is used only for the setting it was measured in
(scenario, backbone preset, frames per clip, resolution, device, bf16); otherwise the plan says that no rate is known
and prints steps and trials alone. Not in the time: each trial's start (Ray Train's workers, the model, the stream
correlation), its evaluations and checkpoints (their counts are printed), and ASHA stopping trials early.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml
from omegaconf import OmegaConf

from raystream.config import ConfigError, compose
from raystream.data import DataError
from raystream.train.capacity import max_resources
from raystream.train.preflight import machine_cpus, stream_plan
from raystream.tune.concurrency import trial_demand
from raystream.tune.space import Cell, SweepPlan, plan as sweep_plan, structured

# A node's steps/s from one run to the next: the H200 campaign's from-memory rates moved by up to 9 % between its
# runs (VideoMAE 11.9 and 10.9, DoRA 2.56 and 2.50; docs/benchmarks.md); the rest is margin.
SPREAD = 1.25


@dataclass(frozen=True)
class Rate:
    """Steps/s of one setting on one device, and where the figure comes from."""

    scenario: str
    backbone: str
    frames_per_clip: int
    resolution: int
    device: str  # "cuda" or "cpu"
    bf16: bool
    batch_per_worker: int
    memory_steps_per_s: float  # from batches held in memory
    live_steps_per_s: Optional[float]  # from the live stream (decoding included), when measured
    optimizer: str  # the optimizer the rate was measured with (bench's label)
    optimizer_step_ms: Dict[str, float] = field(default_factory=dict)  # bench label -> ms of the optimizer step alone
    device_name: str = ""
    date: str = ""
    source: str = ""
    order: Optional[str] = None  # the stream order of the live rate (decoding differs between orders)

    def setting(self) -> str:
        return (f"{self.scenario} {self.backbone} {self.frames_per_clip}x{self.resolution}px on {self.device}"
                f"{' bf16' if self.bf16 else ''}")


_CAMPAIGN = "shipped: docs/benchmarks.md, the GPU campaign's third run (raystream bench per preset) at commit 6a55e9c"
_H200 = dict(frames_per_clip=0, resolution=224, device="cuda", bf16=True, optimizer="orthogonal_adamw",
             device_name="NVIDIA H200", date="2026-11-27", source=_CAMPAIGN, order="batch_along_time")
# The paper presets on one H200 at their per-GPU batch (docs/benchmarks.md, "2026-11-27, third run").
SHIPPED: Tuple[Rate, ...] = (
    Rate(**{**_H200, "frames_per_clip": 4}, scenario="future_prediction", backbone="large", batch_per_worker=16,
         memory_steps_per_s=18.2, live_steps_per_s=18.8,
         optimizer_step_ms={"orthogonal_adamw": 10.04, "orthogonal_adamw_compiled": 28.15, "adamw_foreach": 7.65,
                            "adamw_fused": 3.14}),
    Rate(**{**_H200, "frames_per_clip": 8}, scenario="dora", backbone="small", batch_per_worker=32,
         memory_steps_per_s=2.50, live_steps_per_s=2.41,
         optimizer_step_ms={"orthogonal_adamw": 2.02, "orthogonal_adamw_compiled": 23.90, "adamw_foreach": 1.82,
                            "adamw_fused": 0.57}),
    Rate(**{**_H200, "frames_per_clip": 16}, scenario="videomae", backbone="base", batch_per_worker=64,
         memory_steps_per_s=10.9, live_steps_per_s=7.46,
         optimizer_step_ms={"orthogonal_adamw": 3.72, "orthogonal_adamw_compiled": 18.73, "adamw_foreach": 3.79,
                            "adamw_fused": 1.23}),
)

_BENCH_KEYS = ("scenario", "backbone", "frames_per_clip", "resolution", "device", "batch_size",
               "from_memory_steps_per_s")


def load_bench(path: str) -> Rate:
    """The rate a `raystream bench --json` file holds; ConfigError naming the file and what is wrong with it."""
    where = f"--rate-from {path}"
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file (expected the JSON object `raystream bench --json PATH` writes)") \
            from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    try:
        r = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON ({exc}); expected the object `raystream bench --json PATH` writes") \
            from None
    if not isinstance(r, dict):
        raise ConfigError(f"{where}: a JSON {type(r).__name__}, expected the object `raystream bench --json` writes")
    if "check_failed" in r:
        raise ConfigError(f"{where}: the bench stopped at a failed check ({r['check_failed'].get('name')}) before "
                          "timing any step: no rate in it")
    missing = [k for k in _BENCH_KEYS if k not in r]
    if missing:
        raise ConfigError(f"{where}: lacks {', '.join(missing)}: expected the object `raystream bench --json PATH` "
                          "writes (not `--eval` or `--decoders`)")
    memory, live = r["from_memory_steps_per_s"], r.get("live_steps_per_s")
    for key, value in (("from_memory_steps_per_s", memory), ("live_steps_per_s", live)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{where}: `{key}` = {value!r}, expected a number of steps/s > 0")
    try:
        return Rate(scenario=str(r["scenario"]), backbone=str(r["backbone"]),
                    frames_per_clip=int(r["frames_per_clip"]), resolution=int(r["resolution"]),
                    device=str(r["device"]), bf16=bool(r.get("bf16", False)), batch_per_worker=int(r["batch_size"]),
                    memory_steps_per_s=float(memory), live_steps_per_s=None if live is None else float(live),
                    optimizer=str(r.get("optimizer", "")),
                    optimizer_step_ms={str(k): float(v) for k, v in (r.get("optimizer_step_ms") or {}).items()},
                    device_name=str(r.get("device_name", "")), date=str(r.get("date", "")),
                    source=f"raystream bench --json {path}", order=_bench_order(r.get("overrides")))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: a value of the wrong type ({exc})") from None


def _bench_order(overrides: Any) -> Optional[str]:
    """The stream order a bench read, from the overrides it recorded (None when they no longer compose here)."""
    try:
        return str(compose([str(o) for o in overrides or []]).stream.order)
    except Exception:  # a user's config dir gone, a key renamed since: the order is then unknown, not an error
        return None


def _cell_setting(config: Mapping[str, Any]) -> Tuple[str, str, int, int, str, bool]:
    t, s = config["trainer"], config["stream"]
    device = "cuda" if t["use_gpu"] else "cpu"
    bf16 = bool(t["bf16"]) if t["bf16"] is not None else device == "cuda"
    return (str(config["scenario"]["name"]), str(config["scenario"]["backbone"]["preset"]), int(s["frames_per_clip"]),
            int(s["resolution"]), device, bf16)


def rate_for(config: Mapping[str, Any], rates: Sequence[Rate]) -> Tuple[Optional[Rate], str]:
    """(the rate measured in this config's setting, or None and why none applies)."""
    setting = _cell_setting(config)
    for rate in rates:
        if (rate.scenario, rate.backbone, rate.frames_per_clip, rate.resolution, rate.device, rate.bf16) == setting:
            return rate, ""
    scenario, backbone, frames, resolution, device, bf16 = setting
    wanted = f"{scenario} {backbone} {frames}x{resolution}px on {device}{' bf16' if bf16 else ''}"
    have = "; ".join(r.setting() for r in rates)
    return None, (f"no measured rate for {wanted} (known: {have}): measure this setting on your node with "
                  "`raystream bench <the same overrides> --json bench.json` and pass --rate-from bench.json")


def _optimizer_label(opt: Mapping[str, Any], device: str) -> str:
    """The bench's label of the optimizer step a run builds (torch's AdamW takes its foreach path on CUDA)."""
    if opt["name"] == "orthogonal_adamw" and opt.get("compile") is True:
        return "orthogonal_adamw_compiled"
    if opt["name"] == "adamw" and device == "cuda":
        return "adamw_foreach"
    return str(opt["name"])


def step_seconds(rate: Rate, steps_per_s: float, batch_per_worker: int, optimizer: str) -> Tuple[float, str]:
    """(seconds of one step at per-worker batch `batch_per_worker` with `optimizer`'s step, how it was derived from
    `steps_per_s` measured at the rate's batch with its optimizer)."""
    measured = 1.0 / steps_per_s
    opt_ms = rate.optimizer_step_ms
    ours, theirs = opt_ms.get(optimizer), opt_ms.get(rate.optimizer)
    notes = []
    if ours is not None and theirs is not None:
        rest = max(measured - theirs / 1000.0, 0.0)
        seconds = rest * batch_per_worker / rate.batch_per_worker + ours / 1000.0
        if optimizer != rate.optimizer:
            notes.append(f"{optimizer}'s step {ours:.2f} ms for {rate.optimizer}'s {theirs:.2f}")
    else:
        seconds = measured * batch_per_worker / rate.batch_per_worker
        if optimizer != rate.optimizer:
            notes.append(f"{optimizer}'s step not timed: {rate.optimizer}'s rate used")
    if batch_per_worker != rate.batch_per_worker:
        notes.append(f"scaled from {rate.batch_per_worker} to {batch_per_worker} clips per worker")
    return seconds, "; ".join(notes)


@dataclass
class CellPlan:
    """One grid cell (or the one run of `train`): its trials, steps and the time of each trial's steps."""

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
    cp.trial_s = {"low": cp.steps * min(memory, live) / spread, "estimate": cp.steps * live,
                  "high": cp.steps * max(memory, live) * spread}


def _cells(kind: str, cfg, overrides: Sequence[str]) -> Tuple[str, List[Cell], int]:
    if kind == "train":
        return "train", [Cell(index=0, values={}, config=OmegaConf.to_container(cfg, resolve=True))], 1
    the_plan: SweepPlan = sweep_plan(cfg, overrides)
    return the_plan.name, the_plan.cells, the_plan.num_samples


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
    name, cells, samples = _cells(kind, cfg, overrides)
    explicit = None if kind == "train" else cfg.sweep.max_concurrent_trials
    slots, why = concurrency(cells, len(cells) * samples, have, have_from, explicit)  # before any video is opened

    steps_of: Dict[str, Tuple[int, str]] = {}
    planned: List[CellPlan] = []
    used: Optional[Rate] = None
    for cell in cells:
        c = cell.config
        key = json.dumps([c["data"], c["stream"], c["trainer"]["num_workers"], c["trainer"]["max_steps"]],
                         sort_keys=True, default=str)
        if key not in steps_of:  # each distinct stream opened once, as the sweep's checks do
            try:
                steps, _ = stream_plan(structured(c))
            except (ConfigError, DataError) as exc:
                raise ConfigError(f"sweep `{name}`, cell {cell.label}: {exc}" if kind == "sweep" else str(exc)) \
                    from None
            capped = c["trainer"]["max_steps"] is not None and steps == int(c["trainer"]["max_steps"])
            steps_of[key] = (steps, "trainer.max_steps" if capped else "the stream")
        steps, limited_by = steps_of[key]
        t = c["trainer"]
        workers = int(t["num_workers"])
        device = "cuda" if t["use_gpu"] else "cpu"
        cp = CellPlan(label=cell.label if kind == "sweep" else "", trials=samples, steps=steps, limited_by=limited_by,
                      global_batch=int(c["stream"]["batch_size"]), workers=workers, demand=trial_demand(t),
                      evaluations=_count(steps, int(c["eval"]["every"])),
                      checkpoints=_count(steps, int(t["checkpoint_every"])),
                      optimizer=_optimizer_label(c["optimizer"], device))
        rate, cp.no_rate = rate_for(c, rates)
        if rate is not None:
            used = used or rate
            _time(cp, rate, spread, str(c["stream"]["order"]))
        planned.append(cp)

    trials = sum(cp.trials for cp in planned)
    result = Plan(kind=kind, name=name, overrides=list(overrides), trials=trials, cells=planned, resources=have,
                  resources_from=have_from, concurrent_trials=slots, concurrency_note=why,
                  rate=None if used is None else asdict(used), spread=spread, gpu_hour_price=gpu_hour_price)
    result.not_included = [
        "each trial's start (Ray Train's workers, the model, the stream correlation) and the sweep's",
        "evaluations and checkpoints (counts per trial above; `raystream bench --eval` times an evaluation worker)",
        "trials an early-stopping scheduler (ASHA) ends before their last step",
        "data-parallel workers' gradient all-reduce (each worker taken to run at the measured clips/s)"]
    if all(cp.trial_s is not None for cp in planned):
        order = [cp for _ in range(samples) for cp in planned]  # Tune's order: every cell, once per sample
        result.wall_s = {k: layout([cp.trial_s[k] for cp in order], slots) for k in ("low", "estimate", "high")}
        result.gpu_hours = {k: sum(cp.trials * cp.trial_s[k] * cp.demand.get("GPU", 0.0) for cp in planned) / 3600
                            for k in ("low", "estimate", "high")}
        if gpu_hour_price is not None:
            result.cost = {k: v * gpu_hour_price for k, v in result.gpu_hours.items()}
    return result


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 4 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _range(values) -> str:
    values = list(values)
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def _spread(values: Mapping[str, float], show) -> str:
    return f"{show(values['estimate'])} ({show(values['low'])} to {show(values['high'])})"


def text(p: Plan) -> str:
    """What `raystream plan` prints."""
    what = f"sweep {p.name}" if p.kind == "sweep" else "train"
    samples = p.cells[0].trials if p.cells else 0
    count = (f"{p.trials} trial{'s' if p.trials != 1 else ''}"
             + (f": {len(p.cells)} cells x {samples} sample{'s' if samples != 1 else ''}"
                if p.kind == "sweep" else ""))
    lines = [f"raystream plan: {what} ({count})" + (f"  [{' '.join(p.overrides)}]" if p.overrides else "")]
    if p.rate:
        r = p.rate
        live = f", {r['live_steps_per_s']:.3g} live" if r["live_steps_per_s"] else ""
        lines.append(f"rate: {r['device_name'] or r['device']}, {r['date']} ({r['source']}): "
                     f"{r['scenario']} {r['backbone']} {r['frames_per_clip']}x{r['resolution']}px, "
                     f"{r['batch_per_worker']} clips per worker: {r['memory_steps_per_s']:.3g} steps/s from memory"
                     f"{live}, {r['optimizer']}")
    demand = p.cells[0].demand if p.cells else {}
    lines.append(f"resources: {p.resources_from}: "
                 + ", ".join(f"{v:g} {k}s" for k, v in sorted(p.resources.items()) if k in ("GPU", "CPU"))
                 + "; a trial holds " + ", ".join(f"{v:g} {k}s" for k, v in sorted(demand.items()))
                 + f" -> {p.concurrent_trials} trial{'s' if p.concurrent_trials != 1 else ''} at a time "
                   f"({p.concurrency_note})")
    lines.append("")
    width = max([len(cp.label) for cp in p.cells] + [4])
    lines.append(f"{'cell':<{width}}  {'trials':>6}  {'steps':>9}  {'batch':>11}  {'steps/s':>13}  trial's steps")
    for cp in p.cells:
        rate = (f"{cp.steps_per_s['live']:.3g}-{cp.steps_per_s['memory']:.3g}" if cp.steps_per_s else "no rate")
        time_ = _spread(cp.trial_s, _duration) if cp.trial_s else "-"
        lines.append(f"{cp.label or '-':<{width}}  {cp.trials:>6}  {cp.steps:>9}  "
                     f"{f'{cp.global_batch}/{cp.workers}w':>11}  {rate:>13}  {time_}")
    by = {b: sum(1 for cp in p.cells if cp.limited_by == b) for b in ("the stream", "trainer.max_steps")}
    lines.append("steps: trainer.max_steps capped at the stream's global steps; set by "
                 + ", ".join(f"{b} ({n} cell{'s' if n != 1 else ''})" for b, n in by.items() if n)
                 + f"; per trial {_range(cp.evaluations for cp in p.cells)} evaluation(s), "
                   f"{_range(cp.checkpoints for cp in p.cells)} checkpoint(s)")
    notes = sorted({cp.rate_note for cp in p.cells if cp.rate_note})
    lines += [f"rate: {n}" for n in notes]
    lines.append("")
    if p.wall_s is None:
        reasons = sorted({cp.no_rate for cp in p.cells if cp.no_rate})
        lines += [f"no time or cost: {r}" for r in reasons]
        return "\n".join(lines)
    lines.append(f"wall time:  {_spread(p.wall_s, _duration)}  (estimate at the live rate; the range from the "
                 f"faster rate / {p.spread:g} to the slower x {p.spread:g})")
    if p.gpu_hours["estimate"] == 0:
        lines.append("GPU-hours:  none (the trials use no GPU: trainer.use_gpu=false)")
    else:
        lines.append(f"GPU-hours:  {_spread(p.gpu_hours, lambda h: f'{h:,.1f}')}")
        lines.append(f"cost at {p.gpu_hour_price:g} per GPU-hour:  {_spread(p.cost, lambda c: f'{c:,.0f}')}"
                     if p.cost is not None else "cost: give --gpu-hour-price")
    lines.append("not in the time: " + "; ".join(p.not_included))
    return "\n".join(lines)


def main(kind: str, cfg, overrides: Sequence[str] = (), *, json_out: bool = False, **options: Any) -> int:
    """`raystream plan`: print the plan (or its JSON object with --json). Exit 0; bad input raises ConfigError."""
    p = make_plan(kind, copy.deepcopy(cfg), overrides, **options)
    print(json.dumps(p.as_json(), indent=1) if json_out else text(p), flush=True)
    return 0


__all__ = ["Rate", "SHIPPED", "Plan", "CellPlan", "make_plan", "load_bench", "rate_for", "main", "text"]
