"""Bench objects read back (raystream/bench/results.py): what `raystream plan --rate-from` accepts, and the shipped
campaign file (raystream/bench/h200_campaign.json) in the layout campaign.py writes, its presets as it runs them."""

from __future__ import annotations

import json
import re

import pytest

from raystream.bench.campaign import DEMO_DIR, PRESETS, overrides
from raystream.bench.results import check_rates, read_json, shipped_campaign
from raystream.config import ConfigError, compose


def test_the_shipped_campaign_holds_each_preset_as_the_campaign_runs_it():
    campaign = shipped_campaign()
    assert list(campaign["presets"]) == list(PRESETS)
    for name, preset in campaign["presets"].items():
        assert preset["preset"] == name and preset["overrides"] == overrides(name, False, DEMO_DIR)
        cfg = compose(preset["overrides"])
        bench = preset["bench"]
        assert preset["stream_order"] == cfg.stream.order
        assert (bench["scenario"], bench["backbone"], bench["frames_per_clip"], bench["resolution"],
                bench["batch_size"]) == (cfg.scenario.name, cfg.scenario.backbone.preset, cfg.stream.frames_per_clip,
                                         cfg.stream.resolution, cfg.stream.batch_size // cfg.trainer.num_workers)


@pytest.mark.parametrize("bad, named", [
    ({"live_steps_per_s": 0}, "`live_steps_per_s` = 0, expected a number of steps/s > 0"),
    ({"from_memory_steps_per_s": float("nan")}, "`from_memory_steps_per_s` = nan"),
    ({"check_failed": {"name": "bf16_step", "detail": "x"}}, "the bench stopped at a failed check (bf16_step)"),
])
def test_a_bench_object_without_a_usable_rate_is_named(tmp_path, bad, named):
    good = {"scenario": "videomae", "backbone": "tiny", "frames_per_clip": 4, "resolution": 32, "device": "cpu",
            "batch_size": 2, "from_memory_steps_per_s": 4.0, "live_steps_per_s": 3.0}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(good))
    assert read_json(str(path), "--rate-from x") == good
    with pytest.raises(ConfigError, match="^" + re.escape(f"where: {named}")):
        check_rates({**good, **bad}, "where")
