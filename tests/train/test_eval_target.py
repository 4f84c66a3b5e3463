"""`raystream eval` as a user calls it, checked before Ray starts (raystream/train/eval_target.py, eval_job.prepare):
the config is the training run's own recorded one with the command's overrides on top; a torn checkpoint is named
with its bad file and the checkpoint to evaluate instead; a probe set that cannot be listed fails with exit 2,
naming what was looked for. The run directory is written as a run writes it (a checkpoint of the configured model,
the record's config.yaml), without Ray."""

import json
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from raystream.config import ConfigError, compose
from raystream.models import build_scenario
from raystream.tracking import events, names
from raystream.train import checkpoint as ckpt_files
from raystream.train import eval_job
from raystream.train.eval_target import resolve

TRAINED_WITH = ["scenario.decoder_depth=2", "mlflow.experiment=trained-elsewhere"]  # not the defaults' model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run trained with TRAINED_WITH: its checkpoint at step 4 and, as every finished run's record holds it,
    config.yaml in events.jsonl (runs before raystream_run.json held the config)."""
    run = tmp_path_factory.mktemp("runs") / "trained"
    cfg = compose(TRAINED_WITH)
    model = build_scenario(cfg.scenario, cfg.stream, int(cfg.trainer.seed)).model
    ckpt_files.save(run / ckpt_files.dir_name(4), model_state=model.state_dict(), train_state={},
                    meta={"next_step": 4, "run_name": "trained"})
    (run / "raystream_run.json").write_text(json.dumps({"run_name": "trained"}))
    record = [events.opened("r1", "sqlite:///x.db"),
              events.artifact("r1", names.ARTIFACT_CONFIG, OmegaConf.to_yaml(cfg, resolve=True))]
    (run / events.FILE_NAME).write_text("".join(json.dumps(e) + "\n" for e in record))
    return run


def test_eval_starts_from_the_runs_recorded_config_with_the_commands_overrides_on_top(run_dir):
    from raystream.train.eval_target import run_config

    target = resolve(str(run_dir))
    cfg, line = run_config(target, ["eval.max_probe_samples=7"])
    assert cfg.scenario.decoder_depth == 2 and cfg.mlflow.experiment == "trained-elsewhere"
    assert cfg.eval.max_probe_samples == 7
    assert line == (f"raystream eval: the config of run trained (recorded in {run_dir}/{events.FILE_NAME}) with "
                    "eval.max_probe_samples=7 on top")
    eval_job.prepare(cfg, target)  # the model fits: nothing of the training run's overrides typed again
    with pytest.raises(ConfigError, match="does not fit"):  # the defaults' model, as eval composed before
        eval_job.prepare(compose(["eval.max_probe_samples=7"]), target)
    (run_dir / "raystream_run.json").write_text(json.dumps(  # what a run records when it starts
        {"run_name": "trained", "config": OmegaConf.to_container(compose(TRAINED_WITH + ["eval.seed=5"]))}))
    try:
        cfg, line = run_config(target, ["scenario.decoder_depth=2"])
        assert cfg.eval.seed == 5 and "recorded in" in line and line.endswith("raystream_run.json) with "
                                                                               "scenario.decoder_depth=2 on top")
    finally:
        (run_dir / "raystream_run.json").write_text(json.dumps({"run_name": "trained"}))


def test_a_torn_checkpoint_names_its_bad_file_and_the_checkpoint_to_evaluate_instead(run_dir, tmp_path, capsys):
    run = tmp_path / "trained"
    shutil.copytree(run_dir, run)
    good, torn = run / ckpt_files.dir_name(4), run / ckpt_files.dir_name(8)
    shutil.copytree(good, torn)
    size = (torn / ckpt_files.MODEL_FILE).stat().st_size
    with open(torn / ckpt_files.MODEL_FILE, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ConfigError, match=rf"{torn} is incomplete \(torn\): model.pt is 1000 bytes, {size} were "
                                          rf"written; evaluate {good} instead"):
        resolve(str(torn))
    assert resolve(str(run)).checkpoint == str(good)  # the run directory: its newest complete checkpoint, said
    err = capsys.readouterr().err
    assert f"skipping the incomplete (torn) checkpoint {torn}" in err and f"evaluating {good}" in err
    assert "resum" not in err
    (torn / ckpt_files.MODEL_FILE).write_bytes(b"\0" * size)  # the size recorded, the bytes not a state dict
    with pytest.raises(ConfigError, match=rf"{torn}/model.pt cannot be read \(.*\); evaluate {good} instead"):
        eval_job.check_model_fits(compose(TRAINED_WITH), resolve(str(torn)))


def test_a_probe_set_that_cannot_be_listed_fails_before_ray_starts(run_dir, tmp_path):
    ssv2 = tmp_path / "ssv2"  # the release's labels, no train split under either name
    ssv2.mkdir()
    (ssv2 / "something-something-v2-labels.json").write_text('{"Holding something": "0"}')
    (ssv2 / "labels.json").write_text('{"Holding something": "0"}')
    out = subprocess.run([sys.executable, "-m", "raystream.cli", "eval", str(run_dir), f"eval.dataset={ssv2}"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "looked for something-something-v2-train.json and train.json" in out.stderr
    assert "Traceback" not in out.stderr and "Ray" not in out.stdout + out.stderr.replace("raystream", "")


def test_switching_the_protocol_brings_its_probes_unless_the_command_names_them(run_dir):
    """A VideoMAE run trained with kNN and the linear probe, evaluated with `eval.protocol=vjepa` (as
    docs/paper-scale.md writes it): V-JEPA's attentive and linear probes run, said on the command's line; it kept the
    run's kNN and linear probe without a word before (issue 62). The command's own eval.metrics, or the same
    protocol as the run's, keep what they name."""
    from raystream.train.eval_target import run_config

    target = resolve(str(run_dir))
    cfg, line = run_config(target, ["eval.protocol=vjepa"])
    assert cfg.eval.protocol == "vjepa" and list(cfg.eval.metrics) == ["linear", "attentive"]
    assert line.endswith("with eval.protocol=vjepa on top; eval.protocol=vjepa brings its own probes: "
                         "eval.metrics=[linear, attentive] (the run's were [knn, linear]; set eval.metrics to choose)")
    assert eval_job.what_runs(cfg) == "probes linear, attentive"
    cfg, line = run_config(target, ["eval.protocol=vjepa", "eval.metrics=[attentive]"])
    assert list(cfg.eval.metrics) == ["attentive"] and "brings" not in line
    cfg, line = run_config(target, ["eval.protocol=default", "eval.max_probe_samples=7"])
    assert list(cfg.eval.metrics) == ["knn", "linear"] and "brings" not in line  # the run's protocol already
    cfg, _ = run_config(target, ["eval=vjepa"])  # the group: its own metrics, as composed
    assert list(cfg.eval.metrics) == ["linear", "attentive"]
    assert eval_job.what_runs(compose(["scenario=future_prediction"])) == "held-out pixel error (8 batches)"


def test_the_eval_command_says_which_probes_the_protocol_brought(run_dir, tmp_path, monkeypatch, capfd):
    """Through the command (in this process; it stops before Ray at a probe set that cannot be listed): the line that
    says which config it evaluates names the probes eval.protocol=vjepa brought."""
    from cli_driver import in_process

    ssv2 = tmp_path / "ssv2"  # labels only: no train split
    ssv2.mkdir()
    (ssv2 / "labels.json").write_text('{"Holding something": "0"}')
    with in_process(tmp_path, monkeypatch, capfd) as cli:
        out = cli("eval", str(run_dir), "eval.protocol=vjepa", f"eval.dataset={ssv2}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert ("eval.protocol=vjepa brings its own probes: eval.metrics=[linear, attentive] (the run's were [knn, "
            "linear]; set eval.metrics to choose)") in out.stderr
