"""Initialisation from files and raystream checkpoints: identical outputs, safe loading, clear errors."""

import pickle

import pytest
import torch
from safetensors.torch import save_file

from raystream.models import CheckpointError, build_scenario
from scenario_helpers import stream_cfg, tiny_cfg

X = torch.rand(2, 4, 3, 32, 32)


def _batch():
    return {"frames": X, "index": torch.arange(2), "step": 4}


def _trained(seed=0):
    """A tiny VideoMAE moved away from its initialisation by a few steps."""
    model = build_scenario(tiny_cfg(), stream_cfg(), seed=seed).model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(3):
        model({"frames": torch.rand(2, 4, 3, 32, 32), "index": torch.arange(2), "step": step})["loss"].backward()
        opt.step()
        opt.zero_grad()
    return model


def _from(init):
    return build_scenario(tiny_cfg(**{"backbone.init": str(init)}), stream_cfg(), seed=5).model


def test_pt_file_restores_identical_outputs(tmp_path):
    src = _trained()
    torch.save(src.state_dict(), tmp_path / "weights.pt")
    restored = _from(tmp_path / "weights.pt")
    fresh = build_scenario(tiny_cfg(), stream_cfg(), seed=5).model
    assert not torch.equal(fresh.encode(X)[1], src.encode(X)[1])
    assert torch.equal(restored.encode(X)[1], src.encode(X)[1])
    src.seed = restored.seed  # masks follow the run seed, not the weights
    assert torch.equal(restored(_batch())["loss"], src(_batch())["loss"])


def test_safetensors_and_ray_checkpoint_directories(tmp_path):
    src = _trained()
    save_file(src.state_dict(), str(tmp_path / "w.safetensors"))
    assert torch.equal(_from(tmp_path / "w.safetensors").encode(X)[0], src.encode(X)[0])
    # a run directory of Ray checkpoints (module. prefixes as saved from DDP): the latest checkpoint wins
    old = _trained(seed=1)
    for name, model in (("checkpoint_000002", old), ("checkpoint_000010", src)):
        (tmp_path / "run" / name).mkdir(parents=True)
        torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "run" / name / "model.pt")
    assert torch.equal(_from(tmp_path / "run" / "checkpoint_000002").encode(X)[0], old.encode(X)[0])
    assert torch.equal(_from(tmp_path / "run").encode(X)[0], src.encode(X)[0])
    assert torch.equal(_from(f"run:{tmp_path / 'run'}").encode(X)[0], src.encode(X)[0])


def test_backbone_only_state_dict_initialises_the_encoder(tmp_path):
    src = _trained()
    torch.save(src.encoder.state_dict(), tmp_path / "encoder.pt")
    model = _from(tmp_path / "encoder.pt")
    assert torch.equal(model.encode(X)[1], src.encode(X)[1])
    fresh = build_scenario(tiny_cfg(), stream_cfg(), seed=5).model
    assert torch.equal(model.decoder.head.weight, fresh.decoder.head.weight)  # decoder kept its seeded init


class Evil:
    def __reduce__(self):
        return (print, ("arbitrary code ran",))


def test_malformed_checkpoints_give_clear_errors(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="garbage.pt"):
        _from(garbage)
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"w": Evil()}, protocol=2))
    with pytest.raises(CheckpointError, match="evil.pt"):
        _from(evil)
    tensor_only = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), tensor_only)
    with pytest.raises(CheckpointError, match="tensor.pt.*not a state dict"):
        _from(tensor_only)
    bad_st = tmp_path / "bad.safetensors"
    bad_st.write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        _from(bad_st)
    with pytest.raises(CheckpointError, match="no such file"):
        _from(tmp_path / "missing.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="model.pt"):
        _from(tmp_path / "empty")


def test_mismatched_architecture_names_the_keys(tmp_path):
    other = build_scenario(tiny_cfg(**{"backbone.depth": 2}), stream_cfg(), seed=0).model
    torch.save(other.state_dict(), tmp_path / "shallow.pt")
    with pytest.raises(CheckpointError, match=r"shallow.pt.*missing keys \['blocks.2"):
        _from(tmp_path / "shallow.pt")
    wide = build_scenario(tiny_cfg(**{"backbone.embed_dim": 48}), stream_cfg(), seed=0).model
    torch.save(wide.state_dict(), tmp_path / "wide.pt")
    with pytest.raises(CheckpointError, match="wide.pt.*wrong shape"):
        _from(tmp_path / "wide.pt")
