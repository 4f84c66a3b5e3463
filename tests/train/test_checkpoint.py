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


def test_load_names_missing_files(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="train_state.pt, meta.json"):
        checkpoint.load(tmp_path)
