"""The GPU campaign's CPU dry run (benchmarks/gpu_campaign.sh --device cpu --tiny): the one command a GPU machine
runs takes every phase on tiny models here, so that the script cannot rot between the rare GPU calls."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raystream.bench.campaign import PRESETS
from raystream.data.decode.backends import DECODERS, installed_decoders

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_campaign_dry_run_measures_every_phase_of_every_preset(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CAMPAIGN_CARRY": str(tmp_path / "carry")}
    order = list(reversed(PRESETS))  # --presets picks the order (a GPU call whose budget ends early skips the last)
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_campaign.sh"), "--device", "cpu", "--tiny",
                          "--presets", ",".join(order), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert r["failed"] == [] and r["imported"] == [] and r["tiny"] and r["device"] == "cpu"
    assert list(r["presets"]) == order
    for name, p in r["presets"].items():
        b, e, t = p["bench"], p["estimate"], p["train"]
        assert b["batch_size"] == 2 and b["from_memory_steps_per_s"] > 0 and b["live_steps_per_s"] > 0, name
        assert {"adamw_foreach", "adamw_fused"} <= set(b["optimizer_step_ms"]), name
        # FLOPs counted, MFU unknown on a CPU without --peak-tflops; the model eager, not compiled in a dry run
        assert b["model_flops_per_step"] > 0 and b["from_memory_tflops_per_s"] > 0, name
        assert b["peak_tflops"] is None and b["from_memory_mfu"] is None and b["live_mfu"] is None, name
        assert b["model_compile"]["eager"]["steps_per_s"] == b["from_memory_steps_per_s"], name
        assert b["model_compile"]["compiled"] == {"skipped": "--compile off"}, name
        assert b["checks"]["bf16_step"].startswith("passed"), name
        assert e["batch"] == 2 and e["tensors_bytes"] > 0, name
        # the worker's two steps: one window read back, finite losses, a checkpoint copied and written
        assert t["steps"] == 2 and len(t["losses"]) == 2 and t["checkpoint_bytes"] > 0, name
        assert t["checkpoint_stall_s"] > 0 and t["checkpoint_write_s"] > 0, name
        assert t["host_syncs_in_steps"] is None  # counted on CUDA only
    decoded = r["decode"]["decoders"]
    assert {key.split()[1] for key in decoded} == set(DECODERS)
    assert any(v.get("frames_per_s", 0) > 0 for v in decoded.values()), decoded
    # each installed decoder's library loaded before the timed rows (auto's, measured first, paid it on the GPU)
    assert set(r["decode"]["first_open_s"]) == set(installed_decoders()) and "pyav" in r["decode"]["first_open_s"]
    assert r["eval"]["vit_s16_images_per_s"] > 0 and r["eval"]["vit_b16_clips_per_s"] > 0
    table = (tmp_path / "out" / "campaign.md").read_text()
    assert all(f"| {name} | 2 |" in table for name in PRESETS), table
    assert "MFU against no bf16 peak is known for a CPU" in table and "(MFU ?)" in table
    assert all(f"| {name} | adamw_fused | " in table for name in PRESETS), table  # the optimizer table
    assert table in out.stdout


def test_the_largest_model_comes_first():
    """A device call whose budget ends early skips the last preset: ViT-L, never measured with MFU, is first."""
    assert list(PRESETS)[0] == "future_prediction_vit_l"


def test_an_unknown_preset_is_named_before_anything_runs(tmp_path, capsys):
    from raystream.bench.campaign import main

    with pytest.raises(SystemExit) as info:
        main(["--out", str(tmp_path), "--device", "cpu", "--presets", "dora_vit_s,vit_h"])
    assert info.value.code == 2 and "--presets: unknown vit_h" in capsys.readouterr().err
    assert not (tmp_path / "campaign.json").exists()
