"""The shipped regime (issue 17): `+experiment=regime` composes the stream where the paper's effect holds on a CPU,
`sweep=regime` plans the paper's comparison over it, and a tiny version of that sweep runs end to end as a user
runs it (the CLI in a fresh directory, a local Ray cluster, real decord on the demo videos, MLflow in sqlite):
every trial records the stream correlation measured at run start, and `raystream report` prints the table with
the Figure 1 / Figure 3 plots logged on the sweep's parent run.
"""

from __future__ import annotations

import pytest

from raystream.config import compose
from raystream.tune.space import plan
from sweep_from_cli import cli_env, sweep_and_report

REGIME = ["+experiment=regime", "sweep=regime"]


def test_regime_composes_the_correlated_future_prediction_stream():
    cfg = compose(REGIME)
    assert cfg.experiment == "regime" and cfg.scenario.name == "future_prediction"
    assert cfg.data.demo.kind == "walking_tour"
    s = cfg.stream
    assert (s.order, s.batch_size, s.clip_shift, s.target_frames) == ("batch_along_time", 4, 1, 4)
    assert cfg.trainer.correlation_steps > 0


def test_regime_sweep_plans_the_papers_comparison():
    p = plan(compose(REGIME), REGIME)
    assert p.num_trials == 4 * 2 * 3
    cells = {(c.values["optimizer"], c.values["stream.order"]) for c in p.cells}
    assert cells == {(o, s) for o in ("adamw", "orthogonal_adamw", "orthogonal_adamw_099", "slower_adamw")
                     for s in ("batch_along_time", "shuffled")}
    betas = {c.values["optimizer"]: c.config["optimizer"]["orth_beta"] for c in p.cells
             if c.values["optimizer"].startswith("orthogonal")}
    assert betas == {"orthogonal_adamw": 0.9, "orthogonal_adamw_099": 0.99}
    assert {c.config["optimizer"]["lr"] for c in p.cells} == {1e-3}
    assert {c.config["stream"]["clip_shift"] for c in p.cells} == {1}


@pytest.mark.slow
def test_tiny_regime_sweep_end_to_end(tmp_path):
    """2 trials (Orthogonal-AdamW x batch along time / shuffled, seed 0) of 4 steps on a short walking tour: what
    the sweep records and reports, not its figures (tests/train/test_correlation.py pins those)."""
    db = tmp_path / "mlflow.db"
    overrides = [*REGIME, "optimizer=orthogonal_adamw", "trainer.seed=0", "trainer.max_steps=4",
                 "trainer.correlation_steps=1", "data.demo.frames_per_video=240", "eval.heldout_batches=2",
                 f"data.demo.cache_dir={tmp_path / 'demo'}", f"mlflow.tracking_uri=sqlite:///{db}",
                 "mlflow.experiment=regime-e2e", f"trainer.storage_path={tmp_path / 'results'}"]
    trials, report, logged = sweep_and_report(tmp_path, overrides, cli_env(), db, "regime-e2e")
    for run in trials:
        m = run.data.metrics
        assert -1 <= m["correlation/sequential"] <= 1 and -1 <= m["correlation/shuffled"] <= 1, m
        assert "eval/mse_out_of_stream" in m and "grad_cos_prev" in m
        # where the worker's time went: each phase a run may grow in (raystream/train/loop.py)
        phases = {k: v for k, v in m.items() if k.startswith("time/")}
        assert set(phases) == {f"time/{p}_s" for p in ("start", "correlation", "steps", "checkpoint", "evaluation")}
        assert all(v > 0 for v in phases.values()), phases
    assert "| stream.order | n |" in report and "grad_cos_prev_mean" in report
    assert "| batch_along_time | 1 |" in report and "| shuffled | 1 |" in report
    assert {"report/grad_cos_curves.png", "report/grad_cos_hist.png", "report/report.md"} <= logged
