"""The paper's gradient-correlation figures, drawn from a run's MLflow history and logged as artifacts.

Figure 1: the cosine similarity of consecutive gradients over training steps (highly correlated streams keep
it well above 0). Figure 3: its histogram over the run. Matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import raystream.tracking.names as names

Series = Sequence[Tuple[int, float]]  # (step, value), sorted by step

COSINE_KEYS = (names.GRAD_COS_PREV, names.GRAD_COS_EMA)
LABELS = {names.GRAD_COS_PREV: "cos(g_t, g_{t-1})", names.GRAD_COS_EMA: "cos(g_t, c_{t-1})  (EMA)"}


def history(mlflow_client, run_id: str, keys: Sequence[str] = COSINE_KEYS) -> Dict[str, List[Tuple[int, float]]]:
    """`key -> [(step, value), ...]` sorted by step, for the keys the run has."""
    out = {}
    for key in keys:
        points = mlflow_client.get_metric_history(run_id, key)
        if points:
            out[key] = sorted((int(m.step), float(m.value)) for m in points)
    return out


def grad_cosine_plots(series: Dict[str, Series], out_dir: Path, title: str = "") -> List[Path]:
    """Write `grad_cosine.png` (cosine over steps) and `grad_cosine_hist.png` (histogram) into `out_dir`.

    Returns the files written; none when `series` holds no points.
    """
    series = {k: v for k, v in series.items() if v}
    if not series:
        return []
    import matplotlib  # lazy: every CLI command loads this module; matplotlib only when plotting

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    out_dir.mkdir(parents=True, exist_ok=True)
    files = []

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for key, points in series.items():
        steps, values = zip(*points)
        ax.plot(steps, values, lw=0.8, label=LABELS.get(key, key))
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set(xlabel="step", ylabel="cosine similarity", ylim=(-1.05, 1.05), title=title or "gradient correlation")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    files.append(out_dir / "grad_cosine.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for key, points in series.items():
        ax.hist([v for _, v in points], bins=40, range=(-1, 1), alpha=0.6, label=LABELS.get(key, key))
    ax.set(xlabel="cosine similarity", ylabel="steps", title=title or "gradient correlation")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    files.append(out_dir / "grad_cosine_hist.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)
    return files
