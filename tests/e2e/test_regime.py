"""The shipped regime (issue 17): `+experiment=regime` composes the stream where the paper's effect holds on a CPU,
`sweep=regime` plans the paper's comparison over it, and a tiny sweep over it runs end to end as a user runs it (the
CLI in a fresh directory, real decoding of the demo videos, MLflow in sqlite): every trial records the stream
correlation measured at run start, and `raystream report` prints the table with the Figure 1 / Figure 3 plots logged
on the sweep's parent run. The same tiny sweep (an lr axis) checks the matched-drift report
(tests/e2e/test_matched_drift.py plans the full sweeps).
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
def test_tiny_regime_sweep_end_to_end_with_its_matched_drift_report(tmp_path, ray_cluster, monkeypatch, capfd):
    """3 trials of 3 steps on a short walking tour (Orthogonal-AdamW, seed 0: lr 1e-3 and 4e-3 along time, lr 1e-3
    shuffled), on the session's Ray cluster: `raystream sweep` in this process (`in_process`: no driver process of its
    own; test_e2e_sweep.py runs one) and `raystream report` a subprocess, as a user runs it. What the sweep records
    and reports, not its figures (tests/train/test_correlation.py pins those). One sweep serves the regime's table
    and the matched-drift instrument (issue 46): every trial logs drift/params beside each evaluation, and the report
    prints the matched table and logs the drift plot with the gradient-cosine curves. Its trials also show that a
    sweep's trial logs no LoggedModel unless asked, while its videos are its dataset inputs."""
    from cli_driver import in_process
    from mlflow import MlflowClient

    db = tmp_path / "mlflow.db"
    overrides = ["+experiment=regime", "sweep=matched_regime", "optimizer=orthogonal_adamw", "trainer.seed=0",
                 "sweep.grid={optimizer.lr: [0.001, 0.004], stream.order: [batch_along_time, shuffled]}",
                 "sweep.exclude=[{optimizer.lr: 0.004, stream.order: shuffled}]", "trainer.max_steps=3",
                 "trainer.correlation_steps=1", "data.demo.frames_per_video=240", "eval.heldout_batches=1",
                 "eval.every=2", f"data.demo.cache_dir={tmp_path / 'demo'}", f"mlflow.tracking_uri=sqlite:///{db}",
                 "mlflow.experiment=regime-e2e", f"trainer.storage_path={tmp_path / 'results'}"]
    for key, value in (("RAY_CHDIR_TO_TRIAL_DIR", "0"), ("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")):
        monkeypatch.setenv(key, value)  # what the sweep sets in its process: undone when the test ends
    with in_process(tmp_path, monkeypatch, capfd) as cli:
        trials, report, logged = sweep_and_report(tmp_path, overrides, cli_env(), db, "regime-e2e", trials=3, cli=cli,
                                                 report_process=True)
    client = MlflowClient(f"sqlite:///{db}")
    for run in trials:
        m = run.data.metrics
        assert -1 <= m["correlation/sequential"] <= 1 and -1 <= m["correlation/shuffled"] <= 1, m
        assert "eval/mse_out_of_stream" in m and "grad_cos_prev" in m
        # where the worker's time went: each phase a run may grow in (raystream/train/loop.py)
        phases = {k: v for k, v in m.items() if k.startswith("time/")}
        assert set(phases) == {f"time/{p}_s" for p in ("start", "correlation", "steps", "checkpoint", "evaluation")}
        assert all(v > 0 for v in phases.values()), phases
        steps = lambda key: sorted(x.step for x in client.get_metric_history(run.info.run_id, key))  # noqa: E731
        assert steps("drift/params") == steps("eval/mse_out_of_stream") == [1, 2]  # at eval.every and the end
        assert m["drift/params"] > 0
        # a sweep's trial (`trainer.log_checkpoint_artifact` null, the default) logs no LoggedModel, while its videos
        # are still its dataset inputs (issue 62)
        assert list(client.search_logged_models([run.info.experiment_id],
                                                filter_string=f"source_run_id = '{run.info.run_id}'")) == []
        contexts = {t.value for d in run.inputs.dataset_inputs for t in d.tags if t.key == "mlflow.data.context"}
        assert "training" in contexts, run.inputs.dataset_inputs
    assert "| stream.order | optimizer.lr | n |" in report and "grad_cos_prev_mean" in report
    rows = ("| batch_along_time | 0.001 | 1 |", "| batch_along_time | 0.004 | 1 |", "| shuffled | 0.001 | 1 |")
    assert all(any(line.startswith(row) for line in report.splitlines()) for row in rows), report
    assert "drift/params" in report and "matched drift" in report and "drift/params = " in report
    assert {"report/grad_cos_curves.png", "report/grad_cos_hist.png", "report/report.md", "report/matched.md",
            "report/matched.csv", "report/eval_mse_out_of_stream_vs_drift.png"} <= logged
