"""The four ablation sweeps plan the tables they promise: β with an AdamW reference row, the optimizer (one lr per
optimizer), the batching strategy and the batch size (one pass, so every size sees the same clips)."""

from __future__ import annotations

from collections import Counter

from raystream.config import compose
from raystream.tune.space import plan


def _cells(experiment, sweep):
    overrides = [f"+experiment={experiment}", f"sweep={sweep}"]
    return plan(compose(overrides), overrides).cells


def _rows(cells, *keys):
    """How many seeds each (section.key, ...) row of the composed configs has."""
    return Counter(tuple(c.config[k.split(".")[0]][k.split(".")[1]] for k in keys) for c in cells)


def test_beta_sweep_has_four_betas_and_one_adamw_row_along_time():
    cells = _cells("regime", "ablation_beta")
    assert _rows(cells, "optimizer.name", "optimizer.orth_beta") == {
        ("orthogonal_adamw", 0.0): 3, ("orthogonal_adamw", 0.5): 3, ("orthogonal_adamw", 0.9): 3,
        ("orthogonal_adamw", 0.99): 3, ("adamw", 0.9): 3}
    assert {c.config["stream"]["order"] for c in cells} == {"batch_along_time"}


def test_optimizer_sweep_runs_five_optimizers_in_two_orders_each_at_its_lr():
    cells = _cells("regime", "ablation_optimizer")
    rows = _rows(cells, "optimizer.name", "optimizer.lr", "stream.order")
    lrs = {"adamw": 1e-3, "orthogonal_adamw": 1e-3, "slower_adamw": 1e-3, "orthogonal_torch_adamw": 1e-3,
           "orthogonal_sgd": 1e-2}
    assert rows == {(n, lr, o): 3 for n, lr in lrs.items() for o in ("batch_along_time", "shuffled")}


def test_order_sweep_is_table_2s_shape_on_many_videos():
    cells = _cells("multi_video", "ablation_order")
    assert _rows(cells, "optimizer.name", "stream.order") == {
        (n, o): 3 for n in ("adamw", "orthogonal_adamw") for o in ("batch_along_time", "batch_along_video", "shuffled")}
    assert {c.config["data"]["demo"]["num_videos"] for c in cells} == {32}


def test_batch_size_sweep_sees_the_same_clips_at_every_size():
    cells = _cells("multi_video", "ablation_batch_size")
    assert len(cells) == 2 * 2 * 3 * 3
    assert {c.config["stream"]["batch_size"] for c in cells} == {4, 8, 16}
    assert {(c.config["stream"]["epochs"], c.config["trainer"]["max_steps"]) for c in cells} == {(1, None)}
