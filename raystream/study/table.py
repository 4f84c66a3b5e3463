"""A sweep's report table: its trials (one per Tune trial), grouped into rows by the grid axes that vary, each cell
the mean ± std over the replicate axes (seeds), as Markdown and CSV.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import raystream.tracking.names as names
from raystream.markdown_table import markdown_table
from raystream.study.stats import mean, std

OPTIMIZER_PARAM = "optimizer.name"  # the config key, logged as a param of every run


@dataclass
class Trial:
    run_id: str
    trial_id: str
    status: str
    grid: Dict[str, str]
    sample: Dict[str, float]
    metrics: Dict[str, float]
    optimizer: str
    start_time: int = 0


@dataclass
class Row:
    key: Tuple[str, ...]  # values of the row axes
    trials: List[Trial]  # the chosen trial of each replicate
    failed: int = 0

    def values(self, metric: str) -> List[float]:
        return [t.metrics[metric] for t in self.trials if metric in t.metrics and math.isfinite(t.metrics[metric])]


@dataclass
class Table:
    sweep: str
    parent_run_id: str
    row_axes: List[str]
    seed_axes: List[str]
    sample_axes: List[str]
    metrics: List[str]
    rows: List[Row]
    metric: str = "loss"
    mode: str = "min"
    failures: List[Tuple[str, str]] = field(default_factory=list)  # (trial id, reason)

    def to_markdown(self) -> str:
        """The table in Markdown: a path value shows its last part (the CSV keeps it whole)."""
        header = [*self.row_axes, "n", *self.sample_axes, *map(names.report_column, self.metrics)]
        rows = []
        for row in self.rows:
            cells = [names.path_tail(v) for v in row.key]
            cells += [str(len(row.trials)) + (f" ({row.failed} failed)" if row.failed else "")]
            cells += [_fmt_meanstd([t.sample[k] for t in row.trials if k in t.sample], sci=True)
                      for k in self.sample_axes]
            cells += [_fmt_meanstd(row.values(m)) for m in self.metrics]
            rows.append(cells)
        title = f"sweep `{self.sweep}` (MLflow parent run {self.parent_run_id}); mean ± std over " \
                f"{', '.join(self.seed_axes) or 'trials'}"
        text = title + "\n\n" + markdown_table(header, rows) + "\n"
        if self.failures:
            text += "\nfailed trials:\n" + "".join(f"- {tid}: {why}\n" for tid, why in self.failures)
        return text

    def write_csv(self, path: Path) -> None:
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*self.row_axes, "n", "failed", *self.sample_axes,
                        *[f"{names.report_column(m)}_{s}" for m in self.metrics for s in ("mean", "std")]])
            for row in self.rows:
                out: List[Any] = [*row.key, len(row.trials), row.failed]
                out += [mean([t.sample[k] for t in row.trials if k in t.sample]) for k in self.sample_axes]
                for m in self.metrics:
                    vals = row.values(m)
                    out += [mean(vals), std(vals)]
                w.writerow(["" if v is None else v for v in out])


def _fmt(v: float, sci: bool = False) -> str:
    return f"{v:.2e}" if sci or (v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-3)) else f"{v:.4f}"


def _fmt_meanstd(vals: Sequence[float], sci: bool = False) -> str:
    if not vals:
        return "-"
    if len(vals) == 1:
        return _fmt(vals[0], sci)
    return f"{_fmt(mean(vals), sci)} ± {_fmt(std(vals), sci)}"


def is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False
