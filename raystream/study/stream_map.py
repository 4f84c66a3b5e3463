"""The map (issue 61): for which streams does Orthogonal-AdamW beat AdamW at a matched step, and does that follow how
correlated the stream's consecutive gradients are?

    raystream report --map --experiment map [--out DIR]

Reads every matched-drift sweep of an MLflow experiment (the latest parent run of each sweep file: one sweep per
stream, sweeps/sweep/matched_*.yaml), each a sweep over `optimizer.lr` with AdamW and one or more Orthogonal-AdamW
lines along the stream's order (and AdamW shuffled at one lr). Per stream and Orthogonal-AdamW line, one row:

- the stream's correlation at the start (`correlation/sequential` and `correlation/shuffled`, which every run
  measures at its initial weights before step 0, mean removed, as `raystream data correlation`): one value per seed
  (the runs of a seed share its initial weights), mean ± std over the seeds, from the runs in the stream's order;
- the correlation during training: AdamW's mean consecutive-gradient cosine over its steps (`grad_cos_prev_mean`),
  along the order and shuffled, at the shuffled run's lr (else over AdamW's lrs), mean ± std over seeds;
- Orthogonal-AdamW's advantage over AdamW at matched drift, in stream (`eval/psnr_in_stream`, dB, higher is
  better) and out of stream (`eval/mse_out_of_stream`, in % of AdamW's error, lower is better): both lines read at
  `POINTS` drifts log-spaced over the drifts both reached (matched.at_drift: linear in log drift between measured
  lrs, never extrapolated), the difference averaged over those drifts, with its smallest and largest value; the
  seed spread is the two lines' std combined (root of the sum of squares), averaged likewise. A positive advantage
  means Orthogonal-AdamW is ahead. How much of AdamW's drift range the overlap covers (in log drift) is said too.
  Between two measured lrs the interpolation is a straight line in log drift: where a line's error falls steeply
  and then levels (an elbow between its lrs), the line's value there is overstated, so the lead in the middle of a
  sparse line is read with its smallest and largest values and beside the measured points;
- the tuned comparison: the lead where each line is at its own best lr (no interpolation).

Then whether the correlation predicts the lead (`predictions`): per Orthogonal-AdamW line, over the streams where it
has a matched lead, Spearman's rank correlation between each correlation measure (at the start; AdamW's cosine in
training) and each lead, with its exact permutation p-value (two-sided, every ordering of the streams: at 5 streams
only a perfect ordering reaches p < 0.05, so a map of few streams can show a prediction fail, hardly prove one).

Writes map.md, map.csv and map.png (the advantage against the correlation at the start, one point per stream and
line, seed spread as bars) under `--out` (default reports/map-<experiment>).
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import raystream.tracking.names as names
from raystream.markdown_table import markdown_table
from raystream.study import matched
from raystream.study.plots import save
from raystream.study.report import build_table, latest_sweeps, open_store
from raystream.study.stats import mean, spearman, std
from raystream.study.table import Table

IN_STREAM = "eval/psnr_in_stream"  # dB, higher is better
OUT_OF_STREAM = "eval/mse_out_of_stream"  # lower is better: its advantage is in % of AdamW's
POINTS = 5
ORDER_AXIS = "stream.order"
OPTIMIZER_AXES = ("optimizer", "optimizer.name")  # a group choice (adamw, orthogonal_adamw_099) or the name
ADAMW = "adamw"
SHUFFLED = "shuffled"

MeanStd = Optional[Tuple[float, float, int]]  # mean, std, how many values (None: none)


@dataclass
class Advantage:
    """Orthogonal-AdamW's lead over AdamW at matched drift: the mean over the overlap's drifts, the smallest and
    largest over them, and the seed spread (both lines' std combined, averaged over the drifts)."""

    mean: float
    low: float
    high: float
    spread: float


@dataclass
class MapRow:
    stream: str  # the sweep file's name
    order: str
    line: str  # the Orthogonal-AdamW line (its optimizer value)
    seeds: int
    corr_start: MeanStd  # correlation/sequential at the initial weights, in the stream's order
    corr_start_shuffled: MeanStd
    cos_training: MeanStd  # AdamW's grad_cos_prev_mean in the stream's order
    cos_training_shuffled: MeanStd
    overlap: Optional[Tuple[float, float]]  # the drifts both lines reached
    coverage: float  # share of AdamW's range (log drift) the overlap covers
    in_stream: Optional[Advantage]
    out_of_stream: Optional[Advantage]
    # the lead where each line is at its own best lr (the tuned comparison): (lead, seed spread), None if unmeasured
    tuned_in_stream: Optional[Tuple[float, float]] = None
    tuned_out_of_stream: Optional[Tuple[float, float]] = None


def _axis(table: Table, candidates: Sequence[str]) -> Optional[str]:
    return next((a for a in candidates if a in table.row_axes), None)


def _per_seed(table: Table, rows, metric: str) -> MeanStd:
    """`metric` averaged within each seed over `rows`' trials, then mean ± std over the seeds."""
    by_seed: Dict[Tuple[str, ...], List[float]] = {}
    for row in rows:
        for t in row.trials:
            v = t.metrics.get(metric)
            if v is not None and math.isfinite(v):
                by_seed.setdefault(tuple(t.grid.get(a, "?") for a in table.seed_axes), []).append(v)
    vals = [mean(v) for v in by_seed.values()]
    return (mean(vals), std(vals), len(vals)) if vals else None


def _advantage(adamw: List[matched.Point], orth: List[matched.Point], metric: str,
               drifts: List[float]) -> Optional[Advantage]:
    """Orthogonal-AdamW's lead over AdamW on `metric` at `drifts` (None where either lacks it)."""
    leads, spreads = [], []
    for d in drifts:
        a, o = matched.at_drift(adamw, metric, d), matched.at_drift(orth, metric, d)
        if a is None or o is None:
            return None
        if metric == OUT_OF_STREAM:  # lower is better; in % of AdamW's error
            leads.append(100.0 * (a[0] - o[0]) / a[0])
            spreads.append(100.0 * math.hypot(a[1], o[1]) / a[0])
        else:
            leads.append(o[0] - a[0])
            spreads.append(math.hypot(a[1], o[1]))
    if not leads:
        return None
    return Advantage(mean(leads), min(leads), max(leads), mean(spreads))


def _tuned(adamw: List[matched.Point], orth: List[matched.Point], metric: str) -> Optional[Tuple[float, float]]:
    """Orthogonal-AdamW's lead over AdamW on `metric` where each is at its best measured lr (mean over seeds), in
    the units of `_advantage`, with the two points' seed spreads combined."""
    best = []
    for points in (adamw, orth):
        have = [p.metrics[metric] for p in points if metric in p.metrics]
        if not have:
            return None
        best.append(min(have) if metric == OUT_OF_STREAM else max(have))
    (a, sa), (o, so) = best
    if metric == OUT_OF_STREAM:
        return 100.0 * (a - o) / a, 100.0 * math.hypot(sa, so) / a
    return o - a, math.hypot(sa, so)


def _overlap(adamw: List[matched.Point], orth: List[matched.Point]) -> Tuple[Optional[Tuple[float, float]], float,
                                                                              List[float]]:
    """(the drifts both lines reached, the share of AdamW's log-drift range it covers, POINTS drifts in it)."""
    (a_lo, a_hi), (o_lo, o_hi) = [(min(d), max(d)) for d in ([p.drift[0] for p in pts if p.drift[0] > 0]
                                                            for pts in (adamw, orth))]
    lo, hi = max(a_lo, o_lo), min(a_hi, o_hi)
    if hi < lo:
        return None, 0.0, []
    coverage = 1.0 if a_hi <= a_lo else (math.log(hi) - math.log(lo)) / (math.log(a_hi) - math.log(a_lo))
    if hi == lo:
        return (lo, hi), coverage, [lo]
    step = (math.log(hi) - math.log(lo)) / (POINTS - 1)
    return (lo, hi), coverage, [math.exp(math.log(lo) + i * step) for i in range(POINTS)]


def map_rows(table: Table, stream: Optional[str] = None) -> List[MapRow]:
    """The map's rows of one matched-drift sweep (`stream`: its name on the map, default the sweep's run name): one
    per Orthogonal-AdamW line that has an AdamW line in the same order (none when the sweep does not vary the lr or
    has no AdamW line)."""
    key = matched.drift_key(table)
    opt_axis = _axis(table, OPTIMIZER_AXES)
    if key is None or opt_axis is None:
        return []
    axes = [a for a in table.row_axes if a != matched.LR_AXIS]
    found: Dict[Tuple[str, str], List[matched.Point]] = {}
    for values, points in matched.line_points(table, key).items():
        cell = dict(zip(axes, values))
        found[(cell[opt_axis], cell.get(ORDER_AXIS, "configured"))] = points
    order_of = {a: i for i, a in enumerate(table.row_axes)}
    at = {a: order_of[a] for a in (opt_axis, ORDER_AXIS) if a in order_of}

    def rows_where(opt: Optional[str] = None, order: Optional[str] = None, not_order: Optional[str] = None):
        out = []
        for row in table.rows:
            o = row.key[at[ORDER_AXIS]] if ORDER_AXIS in at else "configured"
            if (opt is None or row.key[at[opt_axis]] == opt) and (order is None or o == order) and o != not_order:
                out.append(row)
        return out

    shuffled_lrs = {row.key[order_of[matched.LR_AXIS]] for row in rows_where(ADAMW, SHUFFLED)}
    out = []
    for (opt, order), orth in found.items():
        adamw = found.get((ADAMW, order))
        if opt == ADAMW or order == SHUFFLED or adamw is None:
            continue
        ordered = rows_where(not_order=SHUFFLED)
        adamw_rows = rows_where(ADAMW, order)
        at_lr = [r for r in adamw_rows if r.key[order_of[matched.LR_AXIS]] in shuffled_lrs] or adamw_rows
        overlap, coverage, drifts = _overlap(adamw, orth)
        seeds = min((len(r.trials) for r in rows_where(opt, order)), default=0)
        out.append(MapRow(
            stream=stream or table.sweep, order=order, line=opt, seeds=seeds,
            corr_start=_per_seed(table, ordered, names.CORRELATION_SEQUENTIAL),
            corr_start_shuffled=_per_seed(table, ordered, names.CORRELATION_SHUFFLED),
            cos_training=_per_seed(table, at_lr, names.GRAD_COS_MEAN),
            cos_training_shuffled=_per_seed(table, rows_where(ADAMW, SHUFFLED), names.GRAD_COS_MEAN),
            overlap=overlap, coverage=coverage,
            in_stream=_advantage(adamw, orth, IN_STREAM, drifts) if drifts else None,
            out_of_stream=_advantage(adamw, orth, OUT_OF_STREAM, drifts) if drifts else None,
            tuned_in_stream=_tuned(adamw, orth, IN_STREAM), tuned_out_of_stream=_tuned(adamw, orth, OUT_OF_STREAM)))
    return out


# ---------------------------------------------------------------------------------------------- the files


def _ms(v: MeanStd, digits: int = 2) -> str:
    return "-" if v is None else f"{v[0]:.{digits}f} ± {v[1]:.{digits}f}"


def _adv(a: Optional[Advantage], unit: str) -> str:
    if a is None:
        return "no overlap"
    return f"{a.mean:+.2f}{unit} ± {a.spread:.2f} ({a.low:+.2f} to {a.high:+.2f})"


def _lead(v: Optional[Tuple[float, float]], unit: str) -> str:
    return "-" if v is None else f"{v[0]:+.2f}{unit} ± {v[1]:.2f}"


HEADER = ["stream", "order", "line", "seeds", "correlation at start (order / shuffled)",
          "AdamW grad cos in training (order / shuffled)", "matched drift (share of AdamW's range)",
          "in stream: PSNR lead, dB", "out of stream: MSE lead, % of AdamW's",
          "each at its best lr: PSNR lead dB / MSE lead %"]


def markdown(rows: List[MapRow]) -> str:
    """The map as a Markdown table; a positive lead is Orthogonal-AdamW ahead."""
    out = []
    for r in rows:
        drift = ("none" if r.overlap is None else
                 f"{r.overlap[0]:.3g}-{r.overlap[1]:.3g} ({100 * r.coverage:.0f}%)")
        out.append([
            r.stream, names.short_value(ORDER_AXIS, r.order), names.short_value("optimizer", r.line), str(r.seeds),
            f"{_ms(r.corr_start)} / {_ms(r.corr_start_shuffled)}",
            f"{_ms(r.cos_training)} / {_ms(r.cos_training_shuffled)}", drift,
            _adv(r.in_stream, ""), _adv(r.out_of_stream, "%"),
            f"{_lead(r.tuned_in_stream, '')} / {_lead(r.tuned_out_of_stream, '%')}"])
    return ("the map: Orthogonal-AdamW's lead over AdamW at matched drift (positive: ahead; mean over the drifts both "
            f"reached, their range in brackets, ± the seed spread), beside the stream's correlation\n\n"
            + markdown_table(HEADER, out) + "\n")


@dataclass
class Prediction:
    """Spearman's rho between a correlation measure and a lead across the streams of one line, and its exact
    two-sided permutation p-value (None past `EXACT_UP_TO` streams)."""

    line: str
    measure: str
    lead: str
    n: int
    rho: float
    p: Optional[float]


MEASURES = (("correlation at start", "corr_start"), ("AdamW grad cos in training", "cos_training"))
LEADS = (("in stream", "in_stream"), ("out of stream", "out_of_stream"))
def predictions(rows: List[MapRow]) -> List[Prediction]:
    """Per Orthogonal-AdamW line with a matched lead on at least 3 streams: rho of each correlation measure against
    each lead over those streams."""
    out = []
    for line in dict.fromkeys(r.line for r in rows):
        for measure, m_attr in MEASURES:
            for lead, l_attr in LEADS:
                pairs = [(getattr(r, m_attr)[0], getattr(r, l_attr).mean) for r in rows
                         if r.line == line and getattr(r, m_attr) is not None and getattr(r, l_attr) is not None]
                if len(pairs) >= 3:
                    rho, p = spearman([a for a, _ in pairs], [b for _, b in pairs])
                    out.append(Prediction(line, measure, lead, len(pairs), rho, p))
    return out


def predictions_markdown(found: List[Prediction]) -> str:
    if not found:
        return ("does the correlation predict the lead? too few streams: a line needs a matched lead on at least 3 "
                "streams\n")
    header = ["line", "correlation measure", "lead", "streams", "Spearman rho", "p (exact, two-sided)"]
    out = [[names.short_value("optimizer", f.line), f.measure, f.lead, str(f.n), f"{f.rho:+.2f}",
            "-" if f.p is None else f"{f.p:.3f}"] for f in found]
    return ("does the correlation predict the lead? Spearman's rank correlation across the streams (positive: more "
            "correlated streams, larger lead; p: the share of all orderings of the streams at least as extreme)\n\n"
            + markdown_table(header, out) + "\n")


def write_csv(rows: List[MapRow], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["stream", "order", "line", "seeds", "corr_start_mean", "corr_start_std", "corr_start_shuffled_mean",
                    "corr_start_shuffled_std", "cos_training_mean", "cos_training_std",
                    "cos_training_shuffled_mean", "cos_training_shuffled_std", "drift_lo", "drift_hi", "coverage",
                    "in_stream_lead_db", "in_stream_low", "in_stream_high", "in_stream_spread",
                    "out_of_stream_lead_pct", "out_of_stream_low", "out_of_stream_high", "out_of_stream_spread",
                    "tuned_in_stream_lead_db", "tuned_in_stream_spread", "tuned_out_of_stream_lead_pct",
                    "tuned_out_of_stream_spread"])
        for r in rows:
            cells = [r.stream, r.order, r.line, r.seeds]
            for v in (r.corr_start, r.corr_start_shuffled, r.cos_training, r.cos_training_shuffled):
                cells += [v[0], v[1]] if v else ["", ""]
            cells += list(r.overlap) if r.overlap else ["", ""]
            cells.append(r.coverage)
            for a in (r.in_stream, r.out_of_stream):
                cells += [a.mean, a.low, a.high, a.spread] if a else ["", "", "", ""]
            for t in (r.tuned_in_stream, r.tuned_out_of_stream):
                cells += list(t) if t else ["", ""]
            w.writerow(cells)
    return path


def plot(rows: List[MapRow], path: Path) -> Optional[Path]:
    """map.png: each lead against the correlation at the start, one point per stream and line (bars: the seed
    spread of the lead and of the correlation), labelled by stream; zero dotted."""
    drawn = [r for r in rows if r.corr_start is not None and (r.in_stream or r.out_of_stream)]
    if not drawn:
        return None
    import matplotlib  # lazy: matplotlib only when a report draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    lines = list(dict.fromkeys(names.short_value("optimizer", r.line) for r in drawn))
    for ax, attr, label in ((axes[0], "in_stream", "in stream: PSNR lead over AdamW (dB)"),
                            (axes[1], "out_of_stream", "out of stream: MSE lead over AdamW (% of its error)")):
        labelled = set()
        for r in drawn:
            a = getattr(r, attr)
            if a is None:
                continue
            line = names.short_value("optimizer", r.line)
            i = lines.index(line)
            ax.errorbar([r.corr_start[0]], [a.mean], xerr=[r.corr_start[1]], yerr=[a.spread], marker="osD^v"[i % 5],
                        color=f"C{i}", capsize=3, linestyle="none", label=None if line in labelled else line)
            labelled.add(line)
            ax.annotate(f"{r.stream.removeprefix('matched_')}, {names.short_value(ORDER_AXIS, r.order)}",
                        (r.corr_start[0], a.mean), fontsize=6, xytext=(4, 3), textcoords="offset points")
        ax.axhline(0.0, color="grey", linestyle=":", linewidth=0.8)
        ax.set(xlabel="correlation of consecutive gradients at the start (order, mean removed)", ylabel=label)
    axes[0].set_title("where Orthogonal-AdamW helps at matched drift (positive: ahead)", fontsize=9)
    save(fig, axes[1], path)
    return path


def write(rows: List[MapRow], out: Path) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "map.md"
    md.write_text(markdown(rows) + "\n" + predictions_markdown(predictions(rows)))
    return [md, write_csv(rows, out / "map.csv"), *filter(None, [plot(rows, out / "map.png")])]


def main(experiment: Optional[str], out: Optional[str] = None, tracking_uri: Optional[str] = None) -> int:
    """`raystream report --map --experiment NAME`: the map of that experiment's matched-drift sweeps."""
    if not experiment:
        print("raystream report: --map reads all the sweeps of one MLflow experiment: give --experiment NAME",
              file=sys.stderr)
        return 2
    store = open_store(experiment, tracking_uri)
    if store is None:
        return 2
    client, uri = store
    try:
        parents = latest_sweeps(client, experiment)
    except LookupError as exc:
        print(f"raystream report: {exc} (tracking URI {uri})", file=sys.stderr)
        return 2
    rows, left_out = [], []
    for parent in parents:
        got = map_rows(build_table(client, parent), parent.data.tags.get(names.SWEEP_TAG))
        rows += got
        if not got:
            left_out.append(parent.data.tags.get(names.SWEEP_TAG, parent.info.run_name))
    out_dir = Path(out) if out else Path("reports") / f"map-{experiment}"
    files = write(rows, out_dir)
    print(markdown(rows))
    print(predictions_markdown(predictions(rows)))
    if left_out:
        print(f"not on the map (no AdamW and Orthogonal-AdamW lines over optimizer.lr with drift logged): "
              f"{', '.join(left_out)}")
    print(f"wrote {', '.join(str(f) for f in files)}")
    return 0
