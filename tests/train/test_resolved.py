"""A run resolved once before Ray starts (raystream/train/resolved.py): its name, run directory in its storage,
videos (data/'s rule), steps and start line; bad input fails there, before anything is written."""

from __future__ import annotations

import os

import pytest

from raystream.config import ConfigError
from raystream.train.resolved import RunOptions, resolve


def test_a_run_is_resolved_once_with_its_videos_directory_and_steps(tiny, workdir):
    run = resolve(tiny("trainer.max_steps=2"), RunOptions(), run_name="resolved")
    assert run.name == "resolved" and run.cfg.trainer.run_name == "resolved"
    assert run.run_dir.uri == run.storage.child("resolved").uri and not os.path.exists(run.run_dir.uri)
    assert run.videos.training.demo and run.videos.training.name.startswith("demo-")
    assert run.videos.probed and all(os.path.isfile(v.path) for v in run.videos.probed)
    assert run.total_steps == 2 and run.skipped == [] and run.init_line is None
    assert run.record == f"{run.run_dir.uri}/events.jsonl"
    assert run.log_model and not run.is_trial  # null log_checkpoint_artifact: a run logs its models
    trial = resolve(tiny("trainer.max_steps=2"), RunOptions(), run_name="t", parent_run_id="p", tags={"a": "b"})
    assert trial.is_trial and not trial.log_model and trial.tags == {"a": "b"}
    assert run.tracking_uri == trial.tracking_uri != ""


def test_a_bad_start_fails_in_resolving_before_anything_is_written(tiny, tmp_path):
    with pytest.raises(ConfigError, match="scenario.backbone.init"):
        resolve(tiny(f"scenario.backbone.init={tmp_path}/missing.pt"), RunOptions(), run_name="bad")
    assert not os.path.exists(os.path.join(str(tiny().trainer.storage_path), "bad"))
