"""A sweep's report figures: each metric against each numeric grid axis (batch size on a log2 axis), and the
paper's gradient-cosine figures over the sweep's trials (Figure 3's histogram per optimizer, Figure 1's curve per
row), and `save`, which every figure of the study (matched drift's, the map's) is written with. Matplotlib's Agg
backend, loaded only when a report draws.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import raystream.tracking.names as names
from raystream.study.stats import mean, std
from raystream.study.table import OPTIMIZER_PARAM, Table, Trial, is_number


def save(fig, ax, path: Path, legend_loc: str = "best") -> Path:
    """Write `fig` to `path` (PNG, 100 dpi) with `ax`'s legend, and free it."""
    import matplotlib.pyplot as plt  # lazy: the caller chose the backend

    ax.legend(fontsize=7, loc=legend_loc)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def plot_vs_axes(table: Table, out: Path) -> List[Path]:
    """Each metric against each numeric row axis (e.g. orth_beta, batch size), one line per other-axes combo."""
    import matplotlib  # lazy: matplotlib only when a report writes plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    files = []
    for ai, axis in enumerate(table.row_axes):
        if not all(is_number(r.key[ai]) for r in table.rows) or len({r.key[ai] for r in table.rows}) < 2:
            continue
        for metric in table.metrics:
            lines: Dict[Tuple[str, ...], List[Tuple[float, float, float]]] = OrderedDict()
            for r in table.rows:
                vals = r.values(metric)
                if vals:
                    other = tuple(v for j, v in enumerate(r.key) if j != ai)
                    lines.setdefault(other, []).append((float(r.key[ai]), mean(vals), std(vals) or 0.0))
            if not lines:
                continue
            fig, ax = plt.subplots(figsize=(5, 3.5))
            others = [a for j, a in enumerate(table.row_axes) if j != ai]
            for other, pts in lines.items():
                pts.sort()
                label = ", ".join(f"{a}={v}" for a, v in zip(others, other)) or metric
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                            capsize=3, label=label)
            ax.set_xlabel(axis)
            ax.set_ylabel(names.report_column(metric))
            if axis.endswith("batch_size"):
                ax.set_xscale("log", base=2)
            ax.set_title(f"{names.report_column(metric)} vs {axis}")
            files.append(save(fig, ax, out / f"{slug(names.report_column(metric))}_vs_{slug(axis)}.png"))
    return files


def plot_grad_cos(client, trials: List[Trial], out: Path) -> Optional[Path]:
    """Histogram of the per-step cosine between consecutive raw gradients, one per optimizer."""
    import matplotlib  # lazy: matplotlib only when a report writes plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    values: Dict[str, List[float]] = defaultdict(list)
    for t in trials:
        if t.status == "FINISHED":
            values[t.grid.get(OPTIMIZER_PARAM, t.optimizer)] += [
                m.value for m in client.get_metric_history(t.run_id, names.GRAD_COS_PREV) if math.isfinite(m.value)]
    values = {k: v for k, v in values.items() if v}
    if not values:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, vals in sorted(values.items()):
        ax.hist(vals, bins=40, range=(-1, 1), alpha=0.5, density=True, label=f"{name} (n={len(vals)})")
    ax.set_xlabel("cos(g_t, g_t-1)")
    ax.set_ylabel("density")
    ax.set_title("gradient cosine between consecutive steps")
    return save(fig, ax, out / "grad_cos_hist.png")


def plot_grad_cos_curves(client, table: Table, out: Path) -> Optional[Path]:
    """The paper's Figure 1 per table row: grad_cos_prev over steps, averaged over the row's seeds (a running mean
    over 9 steps smooths the step-to-step sawtooth), one line per row (e.g. optimizer x order), labelled as the
    trials' run names shorten the row's values (`table1_start, orth_adamw, time`)."""
    import matplotlib  # lazy: matplotlib only when a report writes plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    fig, ax = plt.subplots(figsize=(7, 3.5))
    drawn = 0
    for row in table.rows:
        per_step: Dict[int, List[float]] = defaultdict(list)
        for t in row.trials:
            for m in client.get_metric_history(t.run_id, names.GRAD_COS_PREV):
                if math.isfinite(m.value):
                    per_step[int(m.step)].append(m.value)
        if not per_step:
            continue
        steps = sorted(per_step)
        mean = [sum(per_step[s]) / len(per_step[s]) for s in steps]
        smooth = [sum(mean[max(0, i - 4):i + 5]) / len(mean[max(0, i - 4):i + 5]) for i in range(len(mean))]
        label = ", ".join(names.short_value(a, v) for a, v in zip(table.row_axes, row.key))
        ax.plot(steps, smooth, lw=1, label=label)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set(xlabel="step", ylabel="cos(g_t, g_t-1)", ylim=(-1.05, 1.05),
           title="gradient cosine between consecutive steps (mean over seeds)")
    return save(fig, ax, out / "grad_cos_curves.png", legend_loc="lower left")
