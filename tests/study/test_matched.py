"""The matched-drift table (raystream/study/matched.py) on a hand-made sweep table: interpolation linear in log
drift between measured lr points, seed spread carried along, and no extrapolation outside a line's range."""

import math

import pytest

from raystream.study import matched
from raystream.study.table import Row, Table, Trial

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


def far_sweep():
    """sweep() and a third line that moved the weights far more (Slower-AdamW at a high lr): drift 0.5 and 2."""
    far = sweep()
    far.rows += table([(("slower_adamw", "0.01"), [(0.5, 0.2), (0.5, 0.2)]),
                       (("slower_adamw", "0.1"), [(2.0, 0.1), (2.0, 0.1)])]).rows
    return far


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
    # the common drifts span where both lines reached (0.1-0.2), so both are read at every one of them
    assert "drift/params = 0.1 |" in text and "drift/params = 0.2 |" in text and "outside (" not in text
    orth = next(line for line in text.splitlines() if line.startswith("| orth_adamw | eval/knn_top1"))
    cells = [c.strip() for c in orth.strip("|").split("|")][2:]
    assert cells[0] == "0.4750 ± 0.0000"  # halfway in log from drift 0.05 (0.5) to 0.2 (0.45)
    assert cells[-1] == "0.4500 ± 0.0000"
    assert matched.drift_key(sweep()) == "drift/params"
    # a third line that moved the weights far more (Slower-AdamW at a high lr) does not stretch the scale
    far = far_sweep()
    text = matched.markdown(far)
    assert "drift/params = 0.1 |" in text and "drift/params = 0.2 |" in text
    slower = next(line for line in text.splitlines() if line.startswith("| slow_adamw | eval/knn_top1"))
    assert [c.strip() for c in slower.strip("|").split("|")][2:] == ["outside (0.5-2)"] * matched.MATCHED_POINTS


def test_the_common_drifts_are_where_the_most_lines_overlap():
    def line(lo, hi):
        return [matched.Point(1e-3, (lo, 0.0), {}), matched.Point(2e-3, (hi, 0.0), {})]

    # the regime's sweep of 2026-11-27: AdamW along time and shuffled, Orthogonal-AdamW, Slower-AdamW
    found = {"a": line(0.0671, 0.145), "b": line(0.0665, 0.159), "c": line(0.0511, 0.0889), "d": line(0.0211, 1.92)}
    drifts = matched.common_drifts(found)
    assert drifts[0] == pytest.approx(0.0671) and drifts[-1] == pytest.approx(0.0889) and len(drifts) == 5
    # no two lines overlapping: the whole range, each line outside most of it
    assert matched.common_drifts({"a": line(0.01, 0.02), "b": line(0.1, 0.2)}) == pytest.approx(
        [0.01 * 20 ** (i / 4) for i in range(5)])


def test_a_sweep_without_an_lr_axis_has_no_matched_table():
    t = sweep()
    t.row_axes = ["optimizer", "stream.order"]
    assert matched.markdown(t) == "" and matched.lines(t, "drift/params") == {}


def _png_width(path) -> int:
    import struct

    return struct.unpack(">I", path.read_bytes()[16:20])[0]


def test_a_line_reaching_far_wider_adds_a_panel_of_the_shared_range(tmp_path):
    same_range = table([(("adamw", "0.001"), [(0.1, 0.4), (0.1, 0.4)]), (("adamw", "0.002"), [(0.4, 0.3), (0.4, 0.3)]),
                        (("orthogonal_adamw", "0.001"), [(0.1, 0.5), (0.1, 0.5)]),
                        (("orthogonal_adamw", "0.002"), [(0.4, 0.45), (0.4, 0.45)])])
    (tmp_path / "near").mkdir()
    (near,) = matched.plot(same_range, tmp_path / "near")  # one panel: the lines share their whole range
    far = far_sweep()
    (tmp_path / "far").mkdir()
    (wide,) = matched.plot(far, tmp_path / "far")
    assert near.name == wide.name == "eval_knn_top1_vs_drift.png"
    assert _png_width(wide) > 1.5 * _png_width(near)  # the second panel: the shared range, 0.1-0.2
