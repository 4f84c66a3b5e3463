"""Table 1 in miniature (issue 37): `raystream pretrain-start` makes the pretrained start once (cached),
`+experiment=table1_mini sweep=table1_mini` plans the comparison from it and from random weights, and a smoke-sized
sweep (one seed, AdamW, 2 steps) runs end to end as a user runs it (the CLI in a fresh directory, the session's
Ray cluster, real decord on the demo videos, MLflow in sqlite), and `raystream report` prints the table's columns.
What it checks is that the figures are produced, not their values (docs/results.md has those).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raystream.config import compose
from raystream.train.start import EXPERIMENT, cached, config_hash, start_dir
from raystream.tune.space import plan
from sweep_from_cli import cli_env, sweep_and_report

MINI = ["+experiment=table1_mini", "sweep=table1_mini"]


def test_table1_mini_starts_from_the_cached_start_and_probes_held_out_images():
    cfg = compose(MINI)
    start = compose([f"+experiment={EXPERIMENT}"])
    assert os.path.expanduser(cfg.scenario.backbone.init) == str(start_dir(start))
    assert cfg.eval.dataset == start.eval.dataset and cfg.eval.protocol == "dino"
    assert cfg.data.demo.kind == "walking_tour" and start.data.demo.kind == "photo_pans"
    assert os.path.basename(cfg.eval.dataset) == "heldout_photos_jittered"  # the right halves of the start's photos
    assert start.stream.order == "shuffled" and cfg.stream.order == "batch_along_time"
    assert (cfg.stream.batch_size, cfg.stream.frames_per_clip, cfg.scenario.dora.global_crops) == (32, 8, 2)
    # the start's model is the miniature's: loaded whole
    assert cfg.scenario.backbone.preset == start.scenario.backbone.preset
    assert {k: cfg.scenario.dora[k] for k in ("out_dim", "hidden_dim", "bottleneck_dim", "head_layers")} == \
        {k: start.scenario.dora[k] for k in ("out_dim", "hidden_dim", "bottleneck_dim", "head_layers")}


def test_table1_mini_sweep_plans_table1s_four_rows_from_both_starts():
    p = plan(compose(MINI), MINI)
    assert p.num_trials == 2 * 4 * 3
    rows = {(c.values["optimizer"], c.values["stream.order"]) for c in p.cells}
    assert rows == {("adamw", "batch_along_time"), ("orthogonal_adamw", "batch_along_time"),
                    ("orthogonal_adamw_099", "batch_along_time"), ("adamw", "shuffled")}
    inits = {c.values["scenario.backbone.init"] for c in p.cells}
    assert "random" in inits and len(inits) == 2
    betas = {c.values["optimizer"]: c.config["optimizer"].get("orth_beta") for c in p.cells}
    assert betas["orthogonal_adamw"] == 0.9 and betas["orthogonal_adamw_099"] == 0.99


def test_the_start_is_cached_by_its_config(tmp_path):
    cfg = compose([f"+experiment={EXPERIMENT}", f"trainer.storage_path={tmp_path}"])
    assert cached(cfg) is None
    where = start_dir(cfg)
    where.mkdir(parents=True)
    (where / "start.json").write_text(json.dumps({"config_hash": config_hash(cfg), "metrics": {}}))
    assert cached(cfg) is not None
    other = compose([f"+experiment={EXPERIMENT}", f"trainer.storage_path={tmp_path}", "optimizer.lr=5e-4"])
    assert config_hash(other) != config_hash(cfg) and cached(other) is None


@pytest.mark.slow
def test_smoke_table1_mini_end_to_end(tmp_path, monkeypatch, capfd, ray_cluster):
    """The start (1 step), then 1 trial from it (AdamW along time, seed 0, 2 steps: a gradient cosine; the random
    start, the grid's other value, is excluded: it is every other sweep's start, and the plan of both is
    `test_table1_mini_sweep_plans_table1s_four_rows_from_both_starts`'s): the table's columns, its row for the start,
    and the Figure 2 curves, from the CLI, on the session's Ray cluster. `raystream
    pretrain-start` is a subprocess as a user runs it (`RAY_ADDRESS`: no Ray start); `raystream sweep` and `report`
    run `raystream.cli.main` in this process (`in_process`, on the cluster it holds: two driver processes less; the
    regime's sweep, tests/e2e/test_regime.py, runs both as subprocesses). Probes on 200 images a split."""
    from cli_driver import in_process

    db = tmp_path / "mlflow.db"
    cache = str(tmp_path / "cache")
    env = cli_env(RAYSTREAM_CACHE_DIR=cache, RAY_ADDRESS=ray_cluster)
    common = [f"mlflow.tracking_uri=sqlite:///{db}", "mlflow.experiment=table1-e2e", "eval.dino.epochs=1",
              "eval.max_probe_samples=200"]
    start = [*common, "trainer.max_steps=1", "stream.batch_size=4", "data.demo.num_videos=1",
             "data.demo.frames_per_video=30"]
    out = subprocess.run([sys.executable, "-m", "raystream.cli", "pretrain-start", *start], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "eval/knn_top1_k20" in out.stdout and "eval/linear_top1" in out.stdout
    # cached: the same config finds the record the CLI printed (pretrain-start then trains nothing)
    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", cache)
    record = cached(compose([f"+experiment={EXPERIMENT}", *start]))
    assert record is not None and record["path"] in out.stdout
    # and registered: the start another machine that reaches the tracking server can name (issue 62)
    assert out.stdout.strip().splitlines()[-1].endswith("scenario.backbone.init=models:/raystream-table1-start@s0")

    overrides = [*MINI, *common, "optimizer=adamw", "stream.order=batch_along_time", "trainer.seed=0",
                 "trainer.max_steps=2", "stream.batch_size=4", "stream.frames_per_clip=2",
                 "data.demo.frames_per_video=120", f"trainer.storage_path={tmp_path / 'results'}",
                 "sweep.exclude=[{scenario.backbone.init: random}]"]
    for key, value in (("RAY_CHDIR_TO_TRIAL_DIR", "0"), ("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")):
        monkeypatch.setenv(key, value)  # what the sweep sets in its process: undone when the test ends
    with in_process(tmp_path, monkeypatch, capfd) as cli:
        trials, report, logged = sweep_and_report(tmp_path, overrides, env, db, "table1-e2e", trials=1, cli=cli)
    for run in trials:
        m = run.data.metrics
        assert {"eval/knn_top1_k20", "eval/linear_top1", "grad_cos_prev"} <= set(m), sorted(m)
    header = next(line for line in report.splitlines() if line.startswith("| scenario.backbone.init"))
    for column in ("eval/knn_top1_k20", "eval/linear_top1", "grad_cos_prev_mean"):
        assert column in header
    assert "| table1_start | 1 |" in report  # the start's row, named by its folder
    assert "report/grad_cos_curves.png" in logged



def test_a_missing_start_says_how_to_make_it(tmp_path, monkeypatch):
    from raystream.config import ConfigError
    from raystream.train.preflight import check_backbone_init

    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="raystream pretrain-start"):
        check_backbone_init(compose(MINI))
