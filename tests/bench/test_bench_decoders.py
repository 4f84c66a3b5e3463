"""`raystream bench --decoders` (raystream/bench/decoders.py) on this machine's decoders: a row per installed decoder,
frames/s of a real stream, and which decoder the probe let read the file."""

from __future__ import annotations

import numpy as np

from raystream.bench.decoders import rows_to_measure, stream_rate
from raystream.data.decode.backends import installed_decoders
from raystream.data.decode.torchcodec_reader import cuda_unavailable
from raystream.data.demo.encode import write_video


def test_a_row_per_installed_decoder_with_its_rate_and_who_read_the_file(tmp_path):
    rows = rows_to_measure()
    assert [d for _, d, dev in rows if dev == "cpu"] == list(installed_decoders())
    assert any(dev == "cuda" for _, _, dev in rows) == (cuda_unavailable() is None)
    frames = np.random.default_rng(0).integers(0, 255, (60, 120, 160, 3), dtype=np.uint8)
    video = str(write_video(tmp_path / "v.mp4", frames, 30.0, gop=8))
    label, decoder, device = rows[0]  # the first (auto's choice); the campaign in tests/data/decode streams the others
    r = stream_rate(video, decoder, device, workers=2, repeat=1)
    assert r["read_by"] == decoder and r["frames"] == 8 * 8 and r["frames_per_s"] > 0, label


def test_scaling_rows_per_backend_with_ratios_copies_and_the_counts_the_cores_left_out(tmp_path, capsys):
    from raystream.bench.decoders import print_scaling, scaling

    sc = scaling(tmp_path, counts=(1, 2, 4096), backends=("threads", "processes"), frames=120, epochs=2)
    assert sc["counts"] == [1, 2] and sc["not_measured"] == [4096] and sc["decoder"] == installed_decoders()[0]
    assert [(r["backend"], r["workers"]) for r in sc["rows"]] == [("threads", 1), ("threads", 2), ("processes", 1),
                                                                  ("processes", 2)]
    clip = 16 * 3 * 224 * 224  # VideoMAE's 16 frames at 224 px, copied once into the batch
    for r in sc["rows"]:
        assert r["frames"] == sc["rows"][0]["frames"] > 0 and r["frames_per_s"] > 0
        assert r["batch_bytes_per_clip"] == clip
        # neighbouring clips share half their frames, which are decoded once: fewer bytes than the batch's
        assert 0 < r["decoded_bytes_per_clip"] < clip
    assert [(r["over_1"], r["steady_over_1"]) for r in sc["rows"] if r["workers"] == 1] == [(1.0, 1.0)] * 2
    print_scaling(sc)
    out = capsys.readouterr().out
    assert "[4096] workers not measured" in out and "processes" in out
