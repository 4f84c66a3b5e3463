"""Comparisons at a matched step: for a sweep whose grid varies `optimizer.lr`, each metric against how far the
weights moved (`drift/*`, raystream/train/drift.py), so that an optimizer is not credited for merely stepping less.

Lines are the table's rows with the lr axis taken out (e.g. optimizer x order), one point per lr: the mean over the
row's seeds of the drift (x) and of the metric (y), their standard deviations as bars. The matched table reads
each line at common drift values, log-spaced over the drifts that the most lines all reached (so that they are
compared where they overlap, not where a line with a far wider range, such as Slower-AdamW's, stretches the
scale), interpolating the metric and its seed spread linearly in log drift between the line's two measured
points around the value; a value outside a line's measured range is said so, never extrapolated.

The drift read is the evaluated module's when the scenario has one (DoRA's probes read `drift/teacher_backbone`),
else `drift/params`. Used by `raystream report` (raystream/study/report.py): `matched.md`, `matched.csv` and
`<metric>_vs_drift.png`, artifacts of the sweep's parent run.
"""

from __future__ import annotations

import csv
import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import raystream.tracking.names as names
from raystream.markdown_table import markdown_table
from raystream.study.plots import save
from raystream.study.stats import mean_std

LR_AXIS = "optimizer.lr"
MATCHED_POINTS = 5  # common drift values per table


@dataclass
class Point:
    """One lr of one line: (mean, std) over seeds of the drift and of each metric."""

    lr: float
    drift: Tuple[float, float]
    metrics: Dict[str, Tuple[float, float]]


Lines = Dict[str, List[Point]]  # line label -> points sorted by drift


def drift_key(table) -> Optional[str]:
    """The drift the sweep's metrics are read against: an evaluated module's (`drift/<module>`) when the trials
    logged one, else `drift/params`; None when there is none (runs from before drift was logged)."""
    found = {m for row in table.rows for t in row.trials for m in t.metrics if m.startswith(names.DRIFT_PREFIX)}
    modules = sorted(found - {names.DRIFT_PARAMS})
    return modules[0] if modules else (names.DRIFT_PARAMS if found else None)


def compared_metrics(table) -> List[str]:
    """The table's evaluation metrics (what the optimizers are compared on)."""
    return [m for m in table.metrics if m.startswith(names.EVAL_PREFIX)]


def line_points(table, key: str) -> Dict[Tuple[str, ...], List[Point]]:
    """Per line, keyed by its values of the row axes other than the lr (in `table.row_axes` order), its points
    sorted by drift; only lines measured at two lrs or more. Empty when the sweep's rows do not vary
    `optimizer.lr`."""
    if LR_AXIS not in table.row_axes:
        return {}
    at = table.row_axes.index(LR_AXIS)
    out: Dict[Tuple[str, ...], List[Point]] = OrderedDict()
    for row in table.rows:
        drifts = row.values(key)
        if not drifts:
            continue
        metrics = {m: mean_std(row.values(m)) for m in compared_metrics(table) if row.values(m)}
        out.setdefault(row.key[:at] + row.key[at + 1:], []).append(Point(float(row.key[at]), mean_std(drifts),
                                                                          metrics))
    for points in out.values():
        points.sort(key=lambda p: p.drift[0])
    return OrderedDict((k, v) for k, v in out.items() if len({p.lr for p in v}) >= 2)


def lines(table, key: str) -> Lines:
    """Per line (the row axes other than the lr, as short labels), its points sorted by drift. Empty when the
    sweep's rows do not vary `optimizer.lr`."""
    axes = [a for a in table.row_axes if a != LR_AXIS]
    return OrderedDict((", ".join(names.short_value(a, v) for a, v in zip(axes, values)) or "all", points)
                       for values, points in line_points(table, key).items())


def common_drifts(found: Lines, n: int = MATCHED_POINTS) -> List[float]:
    """`n` drift values log-spaced over the range the most lines all reached: among the lines' measured ranges
    (smallest to largest mean drift), the largest group sharing an interval, and of equal groups the one whose
    shared interval is widest in log drift; that interval. Lines outside it read "outside" in the table. With
    no two lines overlapping, the range from the smallest to the largest drift any line reached."""
    ranges = _ranges(found)
    if not ranges:
        return []
    best = None  # (lines sharing it, log width, lo, hi)
    for x in sorted({lo for lo, _ in ranges}):  # a shared interval starts at some line's lowest drift
        group = [(lo, hi) for lo, hi in ranges if lo <= x <= hi]
        lo, hi = max(lo for lo, _ in group), min(hi for _, hi in group)
        candidate = (len(group), math.log(hi) - math.log(lo), lo, hi)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    count, _, lo, hi = best
    if count < 2:
        lo, hi = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
    if n < 2 or hi <= lo:
        return [lo]
    return [math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1)) for i in range(n)]


def _ranges(found: Lines) -> List[Tuple[float, float]]:
    """Each line's measured range: its smallest and largest positive mean drift (points are sorted by drift)."""
    out = []
    for points in found.values():
        positive = [p.drift[0] for p in points if p.drift[0] > 0]
        if positive:
            out.append((positive[0], positive[-1]))
    return out


def at_drift(points: List[Point], metric: str, drift: float) -> Optional[Tuple[float, float]]:
    """(mean, std) of `metric` at `drift`, linear in log drift between the two measured points around it; None
    outside the line's measured drifts (or where a neighbour lacks the metric)."""
    have = [p for p in points if metric in p.metrics and p.drift[0] > 0]
    for a, b in zip(have, have[1:]):
        lo, hi = a.drift[0], b.drift[0]
        if lo <= drift * (1 + 1e-9) and drift <= hi * (1 + 1e-9):
            w = 0.0 if hi <= lo else (math.log(drift) - math.log(lo)) / (math.log(hi) - math.log(lo))
            w = min(max(w, 0.0), 1.0)
            (ma, sa), (mb, sb) = a.metrics[metric], b.metrics[metric]
            return ma + w * (mb - ma), sa + w * (sb - sa)
    if len(have) == 1 and abs(have[0].drift[0] - drift) <= 1e-9 * drift:
        return have[0].metrics[metric]
    return None


def _range(points: List[Point]) -> str:
    return f"{points[0].drift[0]:.3g}-{points[-1].drift[0]:.3g}"


def markdown(table) -> str:
    """The matched table in Markdown ('' when the sweep does not vary the lr or logged no drift)."""
    key = drift_key(table)
    found = lines(table, key) if key else {}
    drifts = common_drifts(found)
    if not found or not drifts:
        return ""
    header = ["line", "metric", *[f"{key} = {d:.3g}" for d in drifts]]
    out = []
    for metric in compared_metrics(table):
        for label, points in found.items():
            cells = []
            for d in drifts:
                got = at_drift(points, metric, d)
                cells.append(f"{got[0]:.4f} ± {got[1]:.4f}" if got else f"outside ({_range(points)})")
            out.append([label, names.report_column(metric), *cells])
    lr_text = "; ".join(f"{label}: lr {', '.join(f'{p.lr:g}' for p in sorted(points, key=lambda p: p.lr))} "
                        f"reached {key} {_range(points)}" for label, points in found.items())
    return (f"matched drift: each metric interpolated at common values of {key} (linear in log drift between the "
            f"measured lr points; mean ± std over seeds; outside a line's measured range it is not extrapolated)\n"
            f"{lr_text}\n\n" + markdown_table(header, out) + "\n")


def write_csv(table, path: Path) -> Optional[Path]:
    """One row per line x metric x common drift: mean, std (empty outside the measured range)."""
    key = drift_key(table)
    found = lines(table, key) if key else {}
    drifts = common_drifts(found)
    if not found or not drifts:
        return None
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["line", "metric", "drift_key", "drift", "mean", "std", "measured_drift_min", "measured_drift_max"])
        for metric in compared_metrics(table):
            for label, points in found.items():
                for d in drifts:
                    got = at_drift(points, metric, d)
                    w.writerow([label, metric, key, d, *(got if got else ("", "")), points[0].drift[0],
                                points[-1].drift[0]])
    return path


def _draw(ax, found: Lines, metric: str) -> int:
    """The lines of `metric` on `ax` (points labelled by lr, seed spread as bars); how many were drawn."""
    drawn = 0
    for label, points in found.items():
        pts = [p for p in points if metric in p.metrics]
        if not pts:
            continue
        ax.errorbar([p.drift[0] for p in pts], [p.metrics[metric][0] for p in pts],
                    xerr=[p.drift[1] for p in pts], yerr=[p.metrics[metric][1] for p in pts], marker="o",
                    capsize=3, label=label)
        for p in pts:
            ax.annotate(f"{p.lr:g}", (p.drift[0], p.metrics[metric][0]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
        drawn += 1
    ax.set_xscale("log")
    return drawn


def _zoom(ax, found: Lines, metric: str, drifts: List[float]) -> None:
    """`ax` limited to the matched table's drifts (dotted), its y range to what the lines read there."""
    ys = [v for points in found.values() for d in drifts for v in _spread(at_drift(points, metric, d))]
    ys += [v for points in found.values() for p in points
           if metric in p.metrics and drifts[0] / 1.15 <= p.drift[0] <= drifts[-1] * 1.15
           for v in _spread(p.metrics[metric])]
    ax.set_xlim(drifts[0] / 1.15, drifts[-1] * 1.15)
    if ys:
        pad = 0.08 * ((max(ys) - min(ys)) or abs(max(ys)) or 1.0)
        ax.set_ylim(min(ys) - pad, max(ys) + pad)
    for d in drifts:
        ax.axvline(d, color="grey", linestyle=":", linewidth=0.8)


def _spread(got: Optional[Tuple[float, float]]) -> List[float]:
    return [got[0] - got[1], got[0] + got[1]] if got else []


def plot(table, out: Path) -> List[Path]:
    """`<metric>_vs_drift.png` per compared metric: one line per optimizer x order, one point per lr (labelled),
    seed spread as bars in both directions, drift on a log axis. Where the lines reach far wider than the range
    they share, a second panel shows that range (the matched table's drifts, dotted)."""
    key = drift_key(table)
    found = lines(table, key) if key else {}
    if not found:
        return []
    import matplotlib  # lazy: matplotlib only when a report writes plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    drifts = common_drifts(found)
    ranges = _ranges(found)
    zoom = len(drifts) > 1 and max(hi for _, hi in ranges) / min(lo for lo, _ in ranges) > 2 * drifts[-1] / drifts[0]
    files = []
    for metric in compared_metrics(table):
        fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(10 if zoom else 5.5, 3.8), squeeze=False)
        axes = list(axes[0])
        if not _draw(axes[0], found, metric):
            plt.close(fig)
            continue
        if zoom:
            _draw(axes[1], found, metric)
        column = names.report_column(metric)
        for ax in axes:
            ax.set(xlabel=f"{key} (||θ - θ_0|| / ||θ_0||)", ylabel=column)
        axes[0].set_title(f"{column} at matched drift (points: lr)", fontsize=9)
        if zoom:
            _zoom(axes[1], found, metric, drifts)
            axes[1].set_title("where the lines overlap (the matched table's drifts)", fontsize=9)
        files.append(save(fig, axes[0], out / f"{column.replace('/', '_')}_vs_drift.png"))
    return files


def write(table, out: Path) -> List[Path]:
    """matched.md, matched.csv and the drift plots under `out` (nothing when the sweep does not vary the lr)."""
    text = markdown(table)
    if not text:
        return []
    md = out / "matched.md"
    md.write_text(text)
    return [md, *filter(None, [write_csv(table, out / "matched.csv")]), *plot(table, out)]
