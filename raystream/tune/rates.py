"""The measured rates `raystream plan` times a trial's steps with, and the rate model (plan.py's docstring).

A Rate is one setting's steps/s on one device: from a `raystream bench --json` file (`load_bench`, `--rate-from`),
else the shipped H200 figures of the paper presets (SHIPPED: raystream/bench/h200_campaign.json, read and checked by
raystream/bench/results.py, beside the code that writes bench objects). `rate_for` picks the rate measured in a
config's setting; `step_seconds` moves it to another per-worker batch and optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from raystream.bench.results import read_json, shipped_campaign
from raystream.config import ConfigError, compose

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
    trial_parts_s: Dict[str, float] = field(default_factory=dict)  # a trial outside its steps (bench/trial_parts.py)
    trial_process_chain: int = 0  # processes a trial starts one after the other (bench's PROCESS_CHAIN)

    def setting(self) -> str:
        return (f"{self.scenario} {self.backbone} {self.frames_per_clip}x{self.resolution}px on {self.device}"
                f"{' bf16' if self.bf16 else ''}")


def from_bench(r: Mapping[str, Any], where: str, source: str, order: Optional[str]) -> Rate:
    """The Rate of a checked bench object (raystream/bench/results.py); ConfigError naming `where` for a value of
    the wrong type."""
    live = r.get("live_steps_per_s")
    try:
        return Rate(scenario=str(r["scenario"]), backbone=str(r["backbone"]),
                    frames_per_clip=int(r["frames_per_clip"]), resolution=int(r["resolution"]),
                    device=str(r["device"]), bf16=bool(r.get("bf16", False)), batch_per_worker=int(r["batch_size"]),
                    memory_steps_per_s=float(r["from_memory_steps_per_s"]),
                    live_steps_per_s=None if live is None else float(live), optimizer=str(r.get("optimizer", "")),
                    optimizer_step_ms={str(k): float(v) for k, v in (r.get("optimizer_step_ms") or {}).items()},
                    device_name=str(r.get("device_name", "")), date=str(r.get("date", "")), source=source,
                    order=order, trial_parts_s={str(k): float(v) for k, v in (r.get("trial_parts_s") or {}).items()},
                    trial_process_chain=int(r.get("trial_process_chain") or 0))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: a value of the wrong type ({exc})") from None


def load_bench(path: str) -> Rate:
    """The rate a `raystream bench --json` file holds; ConfigError naming the file and what is wrong with it."""
    where = f"--rate-from {path}"
    r = read_json(path, where)
    return from_bench(r, where, f"raystream bench --json {path}", _bench_order(r.get("overrides")))


def _bench_order(overrides: Any) -> Optional[str]:
    """The stream order a bench read, from the overrides it recorded (None when they no longer compose here)."""
    try:
        return str(compose([str(o) for o in overrides or []]).stream.order)
    except Exception:  # a user's config dir gone, a key renamed since: the order is then unknown, not an error
        return None


def shipped() -> Tuple[Rate, ...]:
    """The shipped campaign's presets (raystream/bench/h200_campaign.json), one Rate each, in its order."""
    campaign = shipped_campaign()
    source = f"shipped: {campaign['source']} at commit {campaign['commit']}"
    return tuple(from_bench(p["bench"], f"shipped preset {name}", source, p.get("stream_order"))
                 for name, p in campaign["presets"].items())


# The paper presets on one H200 at their per-GPU batch (docs/benchmarks.md, "2026-11-27, third run").
SHIPPED: Tuple[Rate, ...] = shipped()


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


def optimizer_label(opt: Mapping[str, Any], device: str) -> str:
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


def outside_steps_s(rate: Rate, evaluations: int, checkpoints: int) -> Optional[float]:
    """A trial's seconds outside its steps from the bench's `trial_parts_s` (raystream/bench/trial_parts.py): its
    chain of process starts, the build, the stream correlation, `evaluations` evaluations and `checkpoints`
    checkpoint saves; None when the rate's bench did not measure them (an older file, the shipped campaign)."""
    parts = rate.trial_parts_s
    if not parts:
        return None
    return (rate.trial_process_chain * parts.get("process_start", 0.0) + parts.get("build", 0.0)
            + parts.get("correlation", 0.0) + evaluations * parts.get("evaluation", 0.0)
            + checkpoints * parts.get("checkpoint", 0.0))


__all__ = ["Rate", "SPREAD", "SHIPPED", "load_bench", "from_bench", "shipped", "rate_for", "optimizer_label",
           "step_seconds", "outside_steps_s"]
