"""The GPU campaign's Markdown (raystream/bench/campaign_table.py): the tables of a campaign's result, each section
where its phase ran (the dry run of tests/bench/test_campaign.py reads the presets' tables)."""

import torch


def test_the_decode_worker_scaling_is_a_table_of_the_campaign(tmp_path):
    """gpu_decode (CUDA only, so not in the dry run) measures decoders.py's scaling with DECODE_SCALING; its rows,
    measured here for one count and backend, are the campaign's table."""
    from raystream.bench import decoders
    from raystream.bench.campaign import DECODE_SCALING
    from raystream.bench.campaign_table import markdown

    assert DECODE_SCALING["counts"] == (1, 2, 4, 8, 16)
    sc = decoders.scaling(tmp_path, counts=(1, 4096), backends=("threads",), frames=300)
    r = {"date": "today", "device_name": "cpu", "device": "cpu", "tiny": True, "torch": torch.__version__,
         "commit": None, "budget_s": 1.0, "presets": {}, "failed": [],
         "gpu_decode": {"rows": [], "repeat": 1, "gpu": "no", "scaling": sc}}
    table = markdown(r)
    assert "decode-worker scaling:" in table and "[4096] workers not measured" in table, table
    assert "| threads | 1 | " in table and "| 1.00 |" in table, table


def test_a_preset_skipped_or_failed_is_a_row_and_the_failed_phases_are_named():
    from raystream.bench.campaign_table import markdown

    r = {"date": "today", "device_name": "cpu", "device": "cpu", "tiny": True, "torch": "2", "commit": "abc",
         "budget_s": 60.0, "failed": ["videomae_vit_b.bench", "eval"], "eval": {"error": "RuntimeError: x"},
         "presets": {"dora_vit_s": {"preset": "dora_vit_s", "skipped": "time budget"},
                     "videomae_vit_b": {"bench": {"error": "RuntimeError: out of memory\ntrace"}}}}
    table = markdown(r)
    assert "| dora_vit_s | | | time budget |" in table and "| videomae_vit_b | | | RuntimeError: out of memory |" in table
    assert "evaluation features" not in table and "decode," not in table and "60 s budget" in table
    assert table.endswith("failed: videomae_vit_b.bench, eval (errors in the JSON)\n")
