"""More than a smaller step? (issue 46) The matched-drift sweeps plan their lr grids on both shipped experiments
(the miniature's seeds each from their own start). The smoke-sized sweep that runs the matched-drift report end to
end (drift/params beside each evaluation, the matched table, the drift plot, the gradient-cosine curves; that they
are produced, not their values) is the regime's, in tests/e2e/test_regime.py: one sweep serves both."""

from __future__ import annotations

import os

import pytest

from raystream.config import compose
from raystream.tune.space import plan

ROWS = {("adamw", "batch_along_time"), ("orthogonal_adamw", "batch_along_time"),
        ("slower_adamw", "batch_along_time"), ("adamw", "shuffled")}


@pytest.mark.parametrize("experiment", ["table1_mini", "regime"])
def test_matched_sweeps_plan_four_rows_at_four_lrs_each_spanning_4x(experiment):
    """Both sweeps: the four rows at four lrs spanning 4x, 3 seeds; the miniature's seeds each from their own start
    (table1_start_s<seed>), so its seed spread covers the start."""
    overrides = [f"+experiment={experiment}", f"sweep=matched_{experiment}"]
    p = plan(compose(overrides), overrides)
    assert p.num_trials == 4 * 4 * 3
    assert {(c.values["optimizer"], c.values["stream.order"]) for c in p.cells} == ROWS
    for row in ROWS:  # each line its own lrs (Slower-AdamW's higher: its step is lr x (1 - cos))
        lrs = sorted({c.config["optimizer"]["lr"] for c in p.cells
                      if (c.values["optimizer"], c.values["stream.order"]) == row})
        assert len(lrs) >= 4 and lrs[-1] / lrs[0] >= 4, (row, lrs)
    assert {c.config["optimizer"]["orth_beta"] for c in p.cells if c.values["optimizer"] == "orthogonal_adamw"} == {0.9}
    if experiment == "table1_mini":  # each seed from its own start: the spread covers the start
        starts = {c.values["trainer.seed"]: c.config["scenario"]["backbone"]["init"] for c in p.cells}
        assert {seed: os.path.basename(v) for seed, v in starts.items()} == \
            {seed: f"table1_start_s{seed}" for seed in (0, 1, 2)}
