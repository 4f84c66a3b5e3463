"""More than a smaller step? (issue 46) The matched-drift sweeps plan their lr grids on both shipped experiments
(the miniature's seeds each from their own start), and a smoke-sized one (the regime, AdamW along time, seed 0,
two lr values, 3 steps) runs end to end as a user runs it (the CLI in a fresh directory, a local Ray cluster, real
decoding of the demo videos, MLflow in sqlite): every trial logs drift/params beside each evaluation, and
`raystream report` prints the matched table and logs the drift plot and the gradient-cosine curves. What it checks
is that they are produced, not their values (docs/results.md)."""

from __future__ import annotations

import os

import pytest

from raystream.config import compose
from raystream.tune.space import plan
from sweep_from_cli import cli_env, sweep_and_report

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


@pytest.mark.slow
def test_smoke_matched_regime_end_to_end(tmp_path, ray_cluster):
    """On the session's Ray cluster (as `RAY_ADDRESS`: no Ray start per command)."""
    db = tmp_path / "mlflow.db"
    overrides = ["+experiment=regime", "sweep=matched_regime", "optimizer=adamw", "stream.order=batch_along_time",
                 "trainer.seed=0", "sweep.grid={optimizer.lr: [0.001, 0.004]}",
                 "sweep.exclude=[]", "trainer.max_steps=3",
                 "trainer.correlation_steps=0", "data.demo.frames_per_video=240", "eval.heldout_batches=1",
                 "eval.every=2", f"data.demo.cache_dir={tmp_path / 'demo'}", f"mlflow.tracking_uri=sqlite:///{db}",
                 "mlflow.experiment=matched-e2e", f"trainer.storage_path={tmp_path / 'results'}"]
    trials, report, logged = sweep_and_report(tmp_path, overrides, cli_env(RAY_ADDRESS=ray_cluster), db,
                                             "matched-e2e")
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    for run in trials:
        steps = lambda key: sorted(m.step for m in client.get_metric_history(run.info.run_id, key))  # noqa: E731
        assert steps("drift/params") == steps("eval/mse_out_of_stream") == [1, 2]  # at eval.every and the end
        assert run.data.metrics["drift/params"] > 0
    assert "drift/params" in report and "matched drift" in report and "drift/params = " in report
    assert {"report/matched.md", "report/matched.csv", "report/eval_mse_out_of_stream_vs_drift.png",
            "report/grad_cos_curves.png"} <= logged
