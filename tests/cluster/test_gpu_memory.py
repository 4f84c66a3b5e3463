"""cluster/gpu_memory.py: the GPU-memory table shows which cells `raystream bench` measured (CUDA runs only) and
says how many; every other cell stays an estimate. A tiny VideoMAE at 32 px keeps the estimate's forward cheap."""

import importlib.util
import json
from pathlib import Path

import pytest

GPU_MEMORY = Path(__file__).resolve().parents[2] / "cluster" / "gpu_memory.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_memory", GPU_MEMORY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_json(path: Path, device: str, batch: int, gib: float) -> str:
    path.write_text(json.dumps({"device": device, "scenario": "videomae", "backbone": "tiny", "resolution": 32,
                                "frames_per_clip": 16, "batch_size": batch, "peak_memory_gb": gib}))
    return str(path)


def test_measured_cells_are_marked_and_counted(tmp_path, capsys):
    gpu_memory = _module()
    files = [_bench_json(tmp_path / "a.json", "cuda", 2, 0.75),
             _bench_json(tmp_path / "b.json", "cpu", 4, 9.0)]  # a CPU peak is RSS: not a GPU figure
    assert gpu_memory.main(["--presets", "tiny", "--resolution", "32", "--batch", "2", "4",
                            "--measured", *files]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")][-2:]
    assert cells[0].endswith(" / 0.8 measured") and "measured" not in cells[1], row
    assert "measured by raystream bench: 1 of 2 cells" in out


def test_a_file_that_is_not_a_bench_output_is_named(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"device": "cuda", "peak_memory_gb": 1.0}')  # no scenario, preset, ...: not from raystream bench
    with pytest.raises(SystemExit, match=r"--measured .*notes\.json: not a `raystream bench --json` output"):
        _module().measured_peaks([str(bad)])


def test_without_bench_outputs_every_cell_is_an_estimate(capsys):
    assert _module().main(["--presets", "tiny", "--resolution", "32", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "measured by raystream bench: 0 of 1 cells (every figure above is an estimate)" in out
    assert "measured |" not in out
