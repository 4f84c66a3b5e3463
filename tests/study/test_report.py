"""The report, from a real MLflow store populated the way a sweep records it: parent run with the grid, child runs
tagged with their grid / sampled values; rows over the non-seed grid axes, mean +- std over seeds, best sampled
trial per seed, failed trials listed, Markdown + CSV + plots written and logged on the parent run."""

from __future__ import annotations

import csv
import shutil
import statistics
import time

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from raystream.config import compose, config_dir
from raystream.study import report
from raystream.study.report import build_table, find_parent, write_report
from raystream.tune.space import plan
from raystream.train import storage
from raystream.tracking.parent import ParentClose
from raystream.tune.sweep import TrialOutcome
from raystream.tune.sweep_run import parent_run
from raystream.tune.trial import trial_tags

SWEEP = """name: rep
grid:
  optimizer.name: [adamw, orthogonal_adamw]
  optimizer.orth_beta: [0.5, 0.9]
  trainer.seed: [0, 1, 2]
sample:
  optimizer.lr: loguniform(1e-4, 1e-2)
num_samples: 2
metric: loss
mode: min
"""


def knn(opt, beta, seed, sample):
    return 0.3 + (0.2 if opt == "orthogonal_adamw" else 0.0) + 0.1 * beta + 0.01 * seed + 0.001 * sample


def loss(opt, beta, seed, sample):
    return 1.0 - 0.1 * sample + 0.01 * seed  # sample 1 is the better one everywhere


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory):
    """A finished sweep in MLflow: 2 x 2 x 3 cells x 2 samples, one trial failed (built once: sqlite is slow)."""
    tmp = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        root = tmp / "sweeps"
        shutil.copytree(config_dir(), root)
        (root / "sweep" / "rep.yaml").write_text(SWEEP)
        mp.setenv("RAYSTREAM_CONFIG_DIR", str(root))
        mlflow_uri = f"sqlite:///{tmp / 'mlflow.db'}"
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        yield _populate(mlflow_uri, tmp)


def _populate(mlflow_uri, tmp):
    cfg = compose(["sweep=rep"])
    p = plan(cfg, ["sweep=rep"])
    client = MlflowClient(mlflow_uri)
    parent = parent_run(mlflow_uri, "reptest", "rep-run", cfg, p, None)
    exp_id = client.get_run(parent).info.experiment_id
    info = {"name": "rep", "run_name": "rep-run", "cell_values": [c.values for c in p.cells]}
    outcomes, n = [], 0
    for cell in p.cells:
        opt, beta, seed = (cell.values[k] for k in ("optimizer.name", "optimizer.orth_beta", "trainer.seed"))
        for sample in range(2):
            tid = f"t{n:03d}"
            n += 1
            lr = 1e-3 * (1 + sample)
            tags = {**trial_tags(info, cell.index, tid, {"optimizer.lr": lr}), "mlflow.parentRunId": parent}
            run = client.create_run(exp_id, run_name=f"rep-run-{tid}", tags=tags)
            client.log_param(run.info.run_id, "optimizer.name", opt)
            if opt == "adamw" and beta == 0.9 and seed == 2 and sample == 1:
                client.set_terminated(run.info.run_id, "FAILED")
                outcomes.append(TrialOutcome(tid, cell.values, {}, "failed", error="FloatingPointError: NaN loss"))
                continue
            metrics = [Metric("loss", loss(opt, beta, seed, sample), 0, 5),
                       Metric("eval/knn_top1", knn(opt, beta, seed, sample), 0, 5),
                       Metric("correlation/sequential", 0.8, 0, 0)]
            cos = 0.9 if opt == "adamw" else 0.1
            metrics += [Metric("grad_cos_prev", cos + 0.01 * s, 0, s) for s in range(1, 5)]
            client.log_batch(run.info.run_id, metrics=metrics)
            client.set_terminated(run.info.run_id, "FINISHED")
            outcomes.append(TrialOutcome(tid, cell.values, {}, "finished"))
    ParentClose(mlflow_uri, client.get_run(parent).info, "rep-run", storage.resolve(str(tmp)), {},
                time.time()).end("FINISHED", trials=outcomes)
    return client, parent


def test_table_rows_mean_std_over_seeds_of_the_best_sample(sweep_store):
    client, parent = sweep_store
    table = build_table(client, client.get_run(parent))
    assert table.row_axes == ["optimizer.name", "optimizer.orth_beta"]
    assert table.seed_axes == ["trainer.seed"]
    assert table.metrics == ["correlation/sequential", "eval/knn_top1", "grad_cos_prev_mean", "loss"]
    assert table.rows[0].values("grad_cos_prev_mean") == pytest.approx([0.925] * 3)  # mean of 0.91 .. 0.94
    assert [r.key for r in table.rows] == [("adamw", "0.5"), ("adamw", "0.9"), ("orthogonal_adamw", "0.5"),
                                           ("orthogonal_adamw", "0.9")]
    row = table.rows[2]
    assert len(row.trials) == 3 and row.failed == 0
    expected = [knn("orthogonal_adamw", 0.5, seed, 1) for seed in range(3)]  # sample 1 has the lower loss
    assert sorted(row.values("eval/knn_top1")) == pytest.approx(expected)
    failed_row = table.rows[1]
    assert failed_row.failed == 1
    assert len(failed_row.trials) == 3  # seed 2 still has its sample-0 trial
    md = table.to_markdown()
    mean, std = statistics.mean(expected), statistics.stdev(expected)
    assert "| orthogonal_adamw | 0.5 | 3 | 2.00e-03 ± 0.00e+00 | 0.8000 ± " in md
    assert f"| {mean:.4f} ± {std:.4f} | 0.1250 ± " in md  # eval/knn_top1, then grad_cos_prev_mean
    assert "| adamw | 0.9 | 3 (1 failed) |" in md
    assert "FloatingPointError: NaN loss" in md


def test_the_markdown_table_shows_a_path_value_by_its_last_part_and_the_csv_keeps_it(tmp_path):
    start = "/home/u/.cache/raystream/starts/table1_start"
    table = report.Table(sweep="t", parent_run_id="p", row_axes=["scenario.backbone.init"], seed_axes=[],
                         sample_axes=[], metrics=["loss"], rows=[report.Row(key=(start,), trials=[]),
                                                                 report.Row(key=("random",), trials=[])])
    md = table.to_markdown()
    assert "| table1_start | 0 |" in md and "| random | 0 |" in md and "/home/u" not in md
    table.write_csv(tmp_path / "r.csv")
    assert start in (tmp_path / "r.csv").read_text()


def test_report_files_plots_and_parent_artifacts(sweep_store, tmp_path):
    client, parent = sweep_store
    table, files = write_report(client, client.get_run(parent), str(tmp_path / "out"))
    names = {f.name for f in files}
    assert {"report.md", "report.csv", "grad_cos_hist.png", "grad_cos_curves.png",
            "eval_knn_top1_vs_optimizer.orth_beta.png", "last_step_loss_vs_optimizer.orth_beta.png"} <= names
    with open(tmp_path / "out" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and rows[1]["failed"] == "1"
    assert float(rows[3]["eval/knn_top1_mean"]) == pytest.approx(
        statistics.mean(knn("orthogonal_adamw", 0.9, s, 1) for s in range(3)))
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert {"report/report.md", "report/report.csv", "report/grad_cos_hist.png"} <= logged
    assert all(f.stat().st_size > 0 for f in files)


def test_report_main_by_experiment_prints_the_table(sweep_store, tmp_path, capsys):
    client, parent = sweep_store
    assert find_parent(client, experiment="reptest").info.run_id == parent
    assert report.main(experiment="reptest", out=str(tmp_path / "o")) == 0
    out = capsys.readouterr().out
    assert ("| optimizer.name | optimizer.orth_beta | n | optimizer.lr | correlation/sequential | eval/knn_top1 | "
            "grad_cos_prev_mean | last_step_loss |") in out
    assert report.main(experiment="nope", out=str(tmp_path / "o")) == 2
    assert "no MLflow experiment named 'nope'" in capsys.readouterr().err


def test_report_by_experiment_names_its_sweep_the_single_runs_it_leaves_out_and_the_experiments_there_are(
        sweep_store, tmp_path, capsys):
    client, parent = sweep_store
    exp_id = client.get_run(parent).info.experiment_id
    single = client.create_run(exp_id, run_name="videomae-adamw-time-1")  # a `raystream train` run
    client.set_terminated(single.info.run_id, "FINISHED")
    alone = client.create_experiment("singles-only")
    client.set_terminated(client.create_run(alone, run_name="one").info.run_id, "FINISHED")
    try:
        assert report.main(experiment="reptest", out=str(tmp_path / "o")) == 0
        out = capsys.readouterr().out
        assert f"report of sweep rep-run (MLflow run {parent}), the latest of 1 sweep(s) in experiment 'reptest'" in out
        assert "1 single run(s) of the experiment are in no sweep and not in this report" in out
        assert "mlflow ui --backend-store-uri" in out
        assert report.main(experiment="nope") == 2
        err = capsys.readouterr().err
        assert "no MLflow experiment named 'nope'; the store has " in err and "'reptest'" in err
        assert "'singles-only'" in err
        assert report.main(experiment="singles-only") == 2
        assert "has no sweep parent run" in (err := capsys.readouterr().err) and "1 single run(s)" in err
    finally:
        client.delete_run(single.info.run_id)


def test_parent_run_records_name_file_commit_and_grid(sweep_store):
    client, parent = sweep_store
    run = client.get_run(parent)
    assert run.info.run_name == "rep-run" and run.info.status == "FINISHED"
    assert run.data.params["sweep.grid.optimizer.orth_beta"] == "[0.5, 0.9]"
    assert run.data.params["sweep.sample.optimizer.lr"] == "loguniform(1e-4, 1e-2)"
    assert len(run.data.tags["mlflow.source.git.commit"]) >= 7
    assert run.data.tags["raystream.trials_failed"] == "1"
    assert {a.path for a in client.list_artifacts(parent, "sweep")} >= {"sweep/rep.yaml", "sweep/trials.json",
                                                                       "sweep/composed_config.yaml"}


def test_a_run_logged_under_a_metric_s_old_name_reads_under_its_new_name(sweep_store):
    """The attentive probe was `eval/attn_top1` (default protocol) before it became `eval/attentive_top1`: a sweep
    holding runs of both shares one column, and a sweep whose metric is the old name ranks by the new one."""
    client, _ = sweep_store
    exp = client.create_experiment("renamed")  # beside the sweep's experiment: the sqlite store is built once
    parent = client.create_run(exp, tags={"raystream.grid": '{"trainer.seed": [0, 1]}'})
    client.log_param(parent.info.run_id, "sweep.metric", "eval/attn_top1")
    client.log_param(parent.info.run_id, "sweep.mode", "max")
    for seed, key in enumerate(("eval/attn_top1", "eval/attentive_top1")):
        run = client.create_run(exp, tags={"mlflow.parentRunId": parent.info.run_id, "raystream.trial_id": f"t{seed}",
                                           "raystream.grid.trainer.seed": str(seed)})
        client.log_metric(run.info.run_id, key, 0.5 + seed / 10, step=3)
        client.set_terminated(run.info.run_id, "FINISHED")
    trials = report.load_trials(client, parent)
    assert sorted(t.metrics["eval/attentive_top1"] for t in trials) == pytest.approx([0.5, 0.6])
    assert not any("eval/attn_top1" in t.metrics for t in trials)
    table = build_table(client, client.get_run(parent.info.run_id))
    assert table.metrics == ["eval/attentive_top1"] and table.metric == "eval/attentive_top1"


def test_the_report_of_a_missing_store_creates_none(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert report.main(experiment="missing", tracking_uri=uri) == 2
    err = capsys.readouterr().err
    assert "no MLflow store" in err and uri in err
    assert not (tmp_path / "mlflow.db").exists()
