"""What `raystream plan` prints: a plan (plan.py's `Plan`, its arithmetic done there) as a few lines of text.

The header (the command, its trials, the rate and the resources), one row per cell (trials, steps, batch, steps/s,
the time of a trial, or reused), the steps' and the rate's notes, then the wall time, GPU-hours and cost (or why there
are none) and what the time leaves out.
"""

from __future__ import annotations

from typing import Any, Mapping


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


def _seed_rounds_line(r: Mapping[str, Any]) -> str:
    """The range of a sweep whose seeds are added while its comparison is open (sweep.seeds)."""
    wall = (f", {_duration(r['wall_s_at_least'])} to {_duration(r['wall_s_at_most'])}"
            if "wall_s_at_least" in r else "")
    return (f"seed rounds ({r['key']}: {r['min']} seeds a cell, more while its comparison is open, up to "
            f"{r['max']}): {r['trials_at_least']} to {r['trials_at_most']} trials to run{wall}; the totals below "
            "count every seed up to the most")


def text(p: Any) -> str:
    """What `raystream plan` prints, `p` being plan.py's Plan (not imported: plan.py imports this module)."""
    what = f"sweep {p.name}" if p.kind == "sweep" else "train"
    samples = p.cells[0].trials if p.cells else 0
    count = (f"{p.trials} trial{'s' if p.trials != 1 else ''}"
             + (f": {len(p.cells)} cells x {samples} sample{'s' if samples != 1 else ''}"
                if p.kind == "sweep" else "")
             + (f"; {p.reused} finished before with the same config: reused, not run, not in the totals"
                if p.reused else ""))
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
    lines.append(f"{'cell':<{width}}  {'trials':>6}  {'steps':>9}  {'batch':>11}  {'steps/s':>13}  a trial")
    for cp in p.cells:
        rate = (f"{cp.steps_per_s['live']:.3g}-{cp.steps_per_s['memory']:.3g}" if cp.steps_per_s else "no rate")
        time_ = _spread(cp.trial_s, _duration) if cp.trial_s else "-"
        if cp.reused:
            time_ = "reused" if cp.reused == cp.trials else f"{time_}, {cp.reused} reused"
        lines.append(f"{cp.label or '-':<{width}}  {cp.trials:>6}  {cp.steps:>9}  "
                     f"{f'{cp.global_batch}/{cp.workers}w':>11}  {rate:>13}  {time_}")
    by = {b: sum(1 for cp in p.cells if cp.limited_by == b) for b in ("the stream", "trainer.max_steps")}
    lines.append("steps: trainer.max_steps capped at the stream's global steps; set by "
                 + ", ".join(f"{b} ({n} cell{'s' if n != 1 else ''})" for b, n in by.items() if n)
                 + f"; per trial {_range(cp.evaluations for cp in p.cells)} evaluation(s), "
                   f"{_range(cp.checkpoints for cp in p.cells)} checkpoint(s)")
    notes = sorted({cp.rate_note for cp in p.cells if cp.rate_note})
    lines += [f"rate: {n}" for n in notes]
    if p.seed_rounds:
        lines.append(_seed_rounds_line(p.seed_rounds))
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



__all__ = ["text"]
