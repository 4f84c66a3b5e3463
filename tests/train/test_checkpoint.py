"""Checkpoint files: contents, RNG round trip, loadable with weights_only."""

import json
import random

import numpy as np
import pytest
import torch

from raystream.train import checkpoint


def test_save_load_round_trip_restores_rng_and_optimizer(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    d = checkpoint.save(tmp_path / checkpoint.dir_name(12), model_state=model.state_dict(),
                        train_state={"optimizer": opt.state_dict(), "sums": {"loss": 1.5}, "count": 3},
                        meta={"next_step": 12, "stream": {"step": 12}})
    assert d.name == "checkpoint_00000012"
    expected = (torch.rand(3), np.random.rand(3), random.random())

    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    model_state, train_state, meta = checkpoint.load(d)
    checkpoint.set_rng_state(train_state["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]
    assert meta == json.loads((d / "meta.json").read_text()) and meta["next_step"] == 12
    for k, v in model.state_dict().items():
        assert torch.equal(model_state[k], v)
    opt2 = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.1)
    opt2.load_state_dict(train_state["optimizer"])
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert train_state["sums"] == {"loss": 1.5} and train_state["count"] == 3


def test_a_snapshot_holds_the_state_when_taken_and_a_rewrite_reads_torn_until_complete(tmp_path):
    """The asynchronous write's contract: the snapshot is a host copy (training updating the parameters in place
    afterwards changes nothing written), and writing a checkpoint again first removes its meta.json, so a write cut
    short reads as torn rather than as the older complete checkpoint."""
    import pyarrow.fs as pafs

    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    snap = checkpoint.snapshot(model_state=model.state_dict(), train_state={"count": 1}, meta={"next_step": 4})
    with torch.no_grad():
        model.weight.add_(1.0)  # the next step, while the write is in flight
    fs, d = pafs.LocalFileSystem(), tmp_path / checkpoint.dir_name(4)
    checkpoint.write(fs, str(d), snap)
    model_state, train_state, meta = checkpoint.load(d)
    assert all(torch.equal(model_state[k], before[k]) for k in before)
    assert train_state["count"] == 1 and meta["file_sizes"]["model.pt"] == (d / "model.pt").stat().st_size

    class Cut(RuntimeError):
        pass

    class Unpicklable:
        def __reduce__(self):
            raise Cut("the write is cut short")

    with pytest.raises(Cut):
        checkpoint.write(fs, str(d), checkpoint.Snapshot(model.state_dict(), {"x": Unpicklable()}, {"next_step": 4}))
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint_00000004 .meta.json missing"):
        checkpoint.latest(fs, str(tmp_path))  # not the older complete checkpoint's meta.json


def test_load_names_missing_files(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="train_state.pt, meta.json"):
        checkpoint.load(tmp_path)


@pytest.mark.parametrize("name", ["orthogonal_adamw", "slower_adamw", "adamw"])
def test_grad_cos_prev_is_defined_at_the_first_step_after_a_restore(tmp_path, name):
    """The loop saves `diagnostics_state_dict()` (the previous raw gradient) of the optimizer, or of the
    GradCosineTracker for plain torch optimizers, beside `state_dict()`: the restored run's first cosine equals the
    uninterrupted run's."""
    from raystream.optim import GradCosineTracker, build_optimizer
    from raystream.optim.factory import OptimizerConfig

    cfg = OptimizerConfig(name=name, lr=0.01)
    grads = [torch.randn(5, 3, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def make():
        p = torch.nn.Parameter(torch.ones(5, 3))
        opt = build_optimizer([p], cfg, diagnostics=True)
        return p, opt, opt if hasattr(opt, "diagnostics") else GradCosineTracker([p])

    def step(p, opt, cosines, g) -> float:
        p.grad = g.clone()
        cos = None if cosines is opt else cosines.update()
        opt.step()
        return float(opt.diagnostics()["grad_cos_prev"]) if cosines is opt else cos

    p, opt, cosines = make()
    expected = [step(p, opt, cosines, g) for g in grads]
    p, opt, cosines = make()
    for g in grads[:2]:
        step(p, opt, cosines, g)
    torch.save({"optimizer": opt.state_dict(), "diagnostics": cosines.diagnostics_state_dict()}, tmp_path / "s.pt")
    saved = torch.load(tmp_path / "s.pt", weights_only=True)
    p2, opt2, cosines2 = make()
    p2.data.copy_(p.data)
    opt2.load_state_dict(saved["optimizer"])
    cosines2.load_diagnostics_state_dict(saved["diagnostics"])
    assert step(p2, opt2, cosines2, grads[2]) == pytest.approx(expected[2], abs=1e-6)
    assert np.isfinite(expected[2])


def test_latest_is_the_newest_complete_checkpoint_and_prune_keeps_the_named(tmp_path):
    import pyarrow.fs

    fs, run_dir = pyarrow.fs.LocalFileSystem(), str(tmp_path / "run")
    model = torch.nn.Linear(3, 2)
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path / "run" / checkpoint.dir_name(step), model_state=model.state_dict(),
                        train_state={"count": step}, meta={"next_step": step})
    (tmp_path / "run" / "checkpoint_manager_snapshot.json").write_text("{}")
    newest = tmp_path / "run" / checkpoint.dir_name(40)
    (newest / "train_state.pt").write_bytes((newest / "train_state.pt").read_bytes()[:-5])  # upload cut short
    (tmp_path / "run" / checkpoint.dir_name(30) / "meta.json").write_text('{"next_st')  # meta cut short
    path, meta = checkpoint.latest(fs, run_dir)
    assert path.endswith("checkpoint_00000020") and meta["next_step"] == 20
    assert checkpoint.latest(fs, str(tmp_path / "missing")) is None
    gone = checkpoint.prune(fs, run_dir, {"checkpoint_00000020", "checkpoint_00000040"})
    assert sorted(p.rsplit("/", 1)[-1] for p in gone) == ["checkpoint_00000010", "checkpoint_00000030"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoint_00000020", "checkpoint_00000040", "checkpoint_manager_snapshot.json"]


def test_a_torn_newest_checkpoint_is_skipped_by_name_whichever_record_names_it(tmp_path, capfd):
    """The newest checkpoint's model file cut short (a node lost while writing): a resume falls back to the newest
    complete one and names the one it skipped, whether Ray's record or the storage scan named the torn one; with
    every checkpoint torn it fails naming them all, and loading a torn file names its directory."""
    import pyarrow.fs
    from ray.train import Checkpoint

    fs, run_dir = pyarrow.fs.LocalFileSystem(), tmp_path / "run"
    model = torch.nn.Linear(3, 2)
    for step in (2, 4, 6):
        checkpoint.save(run_dir / checkpoint.dir_name(step), model_state=model.state_dict(),
                        train_state={"count": step}, meta={"next_step": step})
    torn = run_dir / checkpoint.dir_name(6)
    (torn / checkpoint.MODEL_FILE).write_bytes((torn / checkpoint.MODEL_FILE).read_bytes()[:100])

    assert checkpoint.latest(fs, str(run_dir))[0] == str(run_dir / checkpoint.dir_name(4))  # the storage scan
    assert f"skipping torn checkpoint {torn}" in capfd.readouterr().err
    ray_record = Checkpoint(str(torn), filesystem=fs)  # Ray Train's record names the torn one
    older = Checkpoint(str(run_dir / checkpoint.dir_name(2)), filesystem=fs)
    picked = checkpoint.restorable([ray_record, older])
    assert picked.path == str(run_dir / checkpoint.dir_name(4))
    err = capfd.readouterr().err
    assert str(torn) in err and "model.pt is 100 bytes" in err
    assert checkpoint.restorable([older, None]).path == older.path  # complete: taken as it is
    assert checkpoint.restorable([None, None]) is None

    with pytest.raises(checkpoint.CheckpointError, match=f"{torn} cannot be read"):
        checkpoint.load(torn)
    for step in (2, 4):
        (run_dir / checkpoint.dir_name(step) / checkpoint.STATE_FILE).write_bytes(b"")
    with pytest.raises(checkpoint.CheckpointError) as failed:
        checkpoint.restorable([ray_record])
    assert all(checkpoint.dir_name(s) in str(failed.value) for s in (2, 4, 6))
