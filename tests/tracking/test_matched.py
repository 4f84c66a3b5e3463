"""The matched-drift table (raystream/tracking/matched.py) on a hand-made sweep table: interpolation linear in log
drift between measured lr points, seed spread carried along, and no extrapolation outside a line's range."""

import math

import pytest

from raystream.tracking import matched
from raystream.tracking.report_table import Row, Table, Trial

AXES = ["optimizer", "optimizer.lr"]


def trial(drift, knn, seed):
    return Trial(run_id=f"r{seed}", trial_id=f"t{seed}", status="FINISHED", grid={}, sample={},
                 metrics={"drift/params": drift, "eval/knn_top1": knn}, optimizer="?")


def table(rows):
    return Table(sweep="m", parent_run_id="p", row_axes=AXES, seed_axes=["trainer.seed"], sample_axes=[],
                 metrics=["drift/params", "eval/knn_top1"],
                 rows=[Row(key=key, trials=[trial(d, k, i) for i, (d, k) in enumerate(pairs)]) for key, pairs in rows])


def sweep():
    # adamw: lr 1e-3 -> drift 0.1 (knn 0.40 ± s), lr 2e-3 -> drift 0.4 (knn 0.30); orth: drift 0.05 and 0.2
    return table([(("adamw", "0.001"), [(0.1, 0.39), (0.1, 0.41)]), (("adamw", "0.002"), [(0.4, 0.30), (0.4, 0.30)]),
                  (("orthogonal_adamw", "0.001"), [(0.05, 0.5), (0.05, 0.5)]),
                  (("orthogonal_adamw", "0.002"), [(0.2, 0.45), (0.2, 0.45)])])


def test_metric_at_drift_is_linear_in_log_drift_between_measured_points():
    found = matched.lines(sweep(), "drift/params")
    assert list(found) == ["adamw", "orth_adamw"]
    adamw = found["adamw"]
    mean, std = matched.at_drift(adamw, "eval/knn_top1", 0.2)  # halfway in log between 0.1 and 0.4
    assert mean == pytest.approx(0.35)
    assert std == pytest.approx(0.5 * math.sqrt(2e-4))  # the seed spread at 0.1 (std of 0.39, 0.41) halves
    assert matched.at_drift(adamw, "eval/knn_top1", 0.05) is None  # below its range: not extrapolated
    assert matched.at_drift(found["orth_adamw"], "eval/knn_top1", 0.4) is None


def test_matched_table_says_outside_instead_of_extrapolating():
    text = matched.markdown(sweep())
    assert "drift/params = 0.05" in text and "drift/params = 0.4" in text
    orth = next(line for line in text.splitlines() if line.startswith("| orth_adamw | eval/knn_top1"))
    cells = [c.strip() for c in orth.strip("|").split("|")][2:]
    assert cells[0] == "0.5000 ± 0.0000"
    assert cells[-1] == "outside (0.05-0.2)"
    assert matched.drift_key(sweep()) == "drift/params"


def test_a_sweep_without_an_lr_axis_has_no_matched_table():
    t = sweep()
    t.row_axes = ["optimizer", "stream.order"]
    assert matched.markdown(t) == "" and matched.lines(t, "drift/params") == {}
