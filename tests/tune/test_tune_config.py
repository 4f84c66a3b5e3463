"""Sweep files: the shipped ones validate and expand to the intended trials; bad ones fail before Ray starts,
with a message naming the key."""

from __future__ import annotations

import os
import re

import pytest

from raystream.config import ConfigError, compose
from raystream.config.sweep import SampleSpec, parse_sample
from raystream.tune.space import plan

SHIPPED = {"smoke": 4, "paper_table": 54, "beta": 12, "batch_size": 32, "slower_adamw": 9, "projection": 6}


@pytest.mark.parametrize("name, trials", sorted(SHIPPED.items()))
def test_shipped_sweeps_validate_and_plan(name, trials):
    cfg = compose([f"sweep={name}"])
    p = plan(cfg, [f"sweep={name}"])
    assert p.name == name
    assert p.num_trials == trials
    assert len({tuple(sorted(c.values.items())) for c in p.cells}) == len(p.cells)


def test_smoke_is_adamw_vs_orthogonal_x_sequential_vs_shuffled():
    p = plan(compose([]))
    assert [c.values for c in p.cells] == [
        {"optimizer.name": "adamw", "stream.order": "batch_along_time"},
        {"optimizer.name": "adamw", "stream.order": "shuffled"},
        {"optimizer.name": "orthogonal_adamw", "stream.order": "batch_along_time"},
        {"optimizer.name": "orthogonal_adamw", "stream.order": "shuffled"},
    ]
    for c in p.cells:  # the grid values and the sweep's fixed settings reach each cell's config
        assert c.config["optimizer"]["name"] == c.values["optimizer.name"]
        assert c.config["trainer"]["max_steps"] is None and c.config["eval"]["probe_epochs"] == 20


BAD = [
    ("grid:\n  stream.order: shuffled\n", "sweep.grid.stream.order", "a list"),
    ("grid:\n  stream.order: []\n", "sweep.grid.stream.order", "non-empty"),
    ("grid:\n  stream.bogus: [1, 2]\n", "sweep.grid.stream.bogus", "not a config key"),
    ("grid:\n  optimizer.orth_beta: [0.5, 1.5]\n", "sweep.grid.optimizer.orth_beta", r"\[0, 1\)"),
    ("grid:\n  stream.batch_size: [4, many]\n", "sweep.grid.stream.batch_size", "many"),
    ("grid:\n  lr: [1, 2]\n", "sweep.grid.lr", "dotted config key"),
    ("grid:\n  optimizer: [adamw, nope]\n", "sweep.grid", "nope"),
    ("sample:\n  optimizer.lr: logunifrm(1e-5, 1e-3)\n", "sweep.sample.optimizer.lr", "loguniform"),
    ("sample:\n  optimizer.lr: loguniform(1e-3, 1e-5)\n", "sweep.sample.optimizer.lr", "low < high"),
    ("sample:\n  optimizer.orth_beta: uniform(0.5, 2.0)\n", "sweep.sample.optimizer.orth_beta", r"\[0, 1\)"),
    ("sample:\n  optimizer.lr: loguniform(1e-5, 1e-3)\ngrid:\n  optimizer.lr: [0.1]\n",
     "sweep.sample.optimizer.lr", "not also a grid axis"),
    ("fixed:\n  trainer.max_stepz: 3\n", "sweep.fixed.trainer.max_stepz", "not a config key"),
    ("num_samples: 0\n", "sweep.num_samples", ">= 1"),
    ("num_samples: 3\ngrid:\n  stream.order: [shuffled]\n", "sweep.num_samples", "no `sample` axes"),
    ("mode: lowest\n", "sweep.mode", "min or max"),
    ("scheduler: hyperband\n", "sweep.scheduler", "asha"),
    ("scheduler: asha\nmetric: eval/knn_top1\nmode: max\n", "sweep.metric", "per-step metric"),
    ("max_concurrent_trials: 0\n", "sweep.max_concurrent_trials", ">= 1"),
    ("sync_period_s: 0\n", "sweep.sync_period_s", "> 0"),
]


@pytest.mark.parametrize("body, key, expected", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_sweep_files_are_rejected_naming_the_key(sweeps_dir, body, key, expected):
    sweeps_dir("bad", "name: bad\n" + body)
    with pytest.raises(ConfigError) as info:
        cfg = compose(["sweep=bad"])
        plan(cfg, ["sweep=bad"])
    message = str(info.value)
    assert key in message, message
    assert re.search(expected, message), message


def test_cli_rejects_a_bad_sweep_before_ray_starts(sweeps_dir, tmp_path, monkeypatch, capfd):
    """`raystream sweep sweep=bad`, run in this process (tests/cli_driver.py: it fails if Ray was started)."""
    from cli_driver import in_process

    sweeps_dir("bad", "name: bad\ngrid:\n  stream.bogus: [1, 2]\n")
    with in_process(tmp_path, monkeypatch, capfd) as run:
        out = run("sweep", "sweep=bad")
    assert out.returncode == 2, out.stderr
    assert "sweep.grid.stream.bogus" in out.stderr
    assert "Traceback" not in out.stderr
    assert "Ray" not in out.stdout + out.stderr  # failed before ray.init


@pytest.mark.parametrize("text, spec", [
    ("loguniform(1e-5, 1e-3)", SampleSpec("loguniform", (1e-5, 1e-3))),
    ("uniform(0, 0.99)", SampleSpec("uniform", (0, 0.99))),
    ("randint(1, 4)", SampleSpec("randint", (1, 4))),
    ("choice([global, per_tensor])", None),
    ("choice(['global', 'per_tensor'])", SampleSpec("choice", (["global", "per_tensor"],))),
])
def test_parse_sample(text, spec):
    if spec is None:
        with pytest.raises(ValueError, match="literals"):
            parse_sample(text)
    else:
        assert parse_sample(text) == spec


def test_a_cell_whose_stream_cannot_fill_a_batch_fails_before_ray_starts(tmp_path, monkeypatch, capfd):
    """The README's `raystream sweep sweep=paper_table scenario=videomae` (run in this process, tests/cli_driver.py):
    4 demo videos cannot fill a batch_along_video batch of 8; that is found before Ray starts, naming the cell (it
    failed 18 trials before)."""
    from cli_driver import in_process

    with in_process(tmp_path, monkeypatch, capfd) as run:
        out = run("sweep", "sweep=paper_table", "scenario=videomae", f"data.demo.cache_dir={tmp_path / 'demo'}",
                  "data.demo.frames_per_video=60")
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "stream.order=batch_along_video" in out.stderr and "batch_size = 8" in out.stderr
    assert not (tmp_path / "raystream_results").exists()  # Tune never started


def test_max_steps_beyond_the_stream_is_said_before_ray_starts(tmp_path, capsys):
    from raystream.tune.cell_checks import check_cells

    cfg = compose(["sweep=beta", "trainer.max_steps=100000", f"data.demo.cache_dir={tmp_path}",
                   "data.demo.frames_per_video=60"])
    check_cells(plan(cfg, ["sweep=beta", "trainer.max_steps=100000"]))
    err = capsys.readouterr().err
    assert err.count("trainer.max_steps = 100000 but the stream has") == 1, err  # once for the 12 cells


def test_the_readmes_sweep_commands_pass_every_check_made_before_ray(tmp_path, monkeypatch):
    """Each `raystream sweep ...` line of the README plans and passes the pre-Ray cell checks as written; the Table 1
    miniature's, with no start made (`raystream pretrain-start`), fails them saying how to make it."""
    import shlex
    from pathlib import Path

    from raystream.config import ConfigError
    from raystream.tune.cell_checks import check_cells

    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", str(tmp_path))  # no start made there
    readme = Path(__file__).resolve().parents[2] / "docs" / "sweeps-and-configs.md"
    lines = [ln.split("#")[0].strip() for ln in readme.read_text().splitlines() if ln.startswith("raystream sweep")]
    assert len(lines) >= 3
    for line in lines:
        overrides = shlex.split(line)[2:] + [f"data.demo.cache_dir={tmp_path}", "data.demo.frames_per_video=60"]
        overrides = [o for o in overrides if not o.startswith("--")]
        if not any(o.startswith("sweep=") for o in overrides):
            overrides.append("sweep=smoke")
        if "+experiment=table1_mini" in overrides:
            with pytest.raises(ConfigError, match="make it first with `raystream pretrain-start`"):
                check_cells(plan(compose(overrides), overrides))
            continue
        check_cells(plan(compose(overrides), overrides))


def test_optuna_info_lines_are_kept_off_the_terminal():
    import logging

    import optuna

    from raystream.tune.sweep import quiet_optuna

    optuna.logging.set_verbosity(optuna.logging.INFO)
    quiet_optuna()
    assert optuna.logging.get_verbosity() == logging.WARNING


def test_rays_internal_noise_is_dropped_and_raystreams_lines_kept():
    from raystream.train.ray_start import without_ray_noise

    progress = {"actor_name": "RayTrainWorker", "pid": 1, "is_err": False,
                "lines": ["[smoke-x] step 6/6 | 21.7 clips/s | loss 0.6981"]}
    assert without_ray_noise(progress) == progress
    assert without_ray_noise({"actor_name": "PlacementGroupCleaner", "lines": ["Traceback (most recent call last):"]}) \
        is None
    mixed = {"actor_name": "TrainController", "pid": 2, "lines": [
        "core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' and ID: 'a7' has constructor arguments",
        "a real error"]}
    assert without_ray_noise(mixed)["lines"] == ["a real error"]
    assert without_ray_noise({"pid": "raylet", "lines": [
        "WARNING: 8 PYTHON worker processes have been started on node ..."]}) is None
    controller = {"actor_name": "TrainController", "pid": 3, "lines": [
        "Failed to send resource request for TrainController-1. If this only happens transiently during network "
        "partition or CPU being overloaded, it's safe to ignore this error.",
        "Traceback (most recent call last):",
        '  File "autoscaling_coordinator_client.py", line 58, in _send_resource_request',
        "    ray.get(",
        "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
        "",
        "Training finished."]}
    assert without_ray_noise(controller)["lines"] == ["", "Training finished."]


def test_sync_period_sets_tunes_checkpoint_period_for_one_sweep_only(monkeypatch):
    """sweep.sync_period_s reaches Tune's TUNE_GLOBAL_CHECKPOINT_S while the sweep runs and is gone after it, so a
    second sweep in the same process gets its own period; a value the user set is left as it is."""
    from raystream.tune.sweep import _checkpoint_period

    monkeypatch.delenv("TUNE_GLOBAL_CHECKPOINT_S", raising=False)
    with _checkpoint_period(1):
        assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "1.0"
    assert "TUNE_GLOBAL_CHECKPOINT_S" not in os.environ
    with _checkpoint_period(30):
        assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "30.0"
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "7")
    with _checkpoint_period(1):
        assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "7"
    assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "7"


def test_a_progress_line_is_printed_once_even_when_a_trial_reports_its_step_again(capsys):
    """A trial reports its last step again (its evaluation, its end) more than `every_s` later: the sweep's
    terminal shows that step's line once (it printed `[02:39] adamw-shuffled step 14 loss 0.5784` twice)."""
    from ray.tune.experiment import Trial

    from raystream.tune.console import SweepConsole

    console = SweepConsole([{}], [], every_s=0.0)
    trial = Trial("__fake", config={}, trial_id="t1", stub=True)
    for result in ({"steps_done": 10, "loss": 0.6}, {"steps_done": 14, "loss": 0.5784},
                   {"steps_done": 14, "loss": 0.5784, "eval/knn_top1": 0.2}, {"steps_done": 16, "loss": 0.5}):
        console.on_trial_result(0, [trial], trial, result)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("] ", 1)[1].split(None, 1)[1] for line in lines] == \
        ["step 10  loss 0.6", "step 14  loss 0.5784", "step 16  loss 0.5"]
