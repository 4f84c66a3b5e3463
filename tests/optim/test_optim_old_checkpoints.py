"""A checkpoint written before optim/ took torch's adamw.py shape (issue 36) loads: each optimizer's state_dict as
the code of commit 6776200 saved it (fixtures/old_state_dicts.pt, written by fixtures/make_old_state_dicts.py then)
is loaded into today's optimizer of the same settings, which then takes the same two steps that code took."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from make_old_state_dicts import MAKERS, _groups, grads_of, params_of  # noqa: E402

OLD = torch.load(Path(__file__).parent / "fixtures" / "old_state_dicts.pt")


@pytest.mark.parametrize("name", list(OLD))
def test_an_old_state_dict_loads_and_continues_the_old_trajectory(name):
    record = OLD[name]
    params = params_of()
    with torch.no_grad():
        for p, saved in zip(params, record["params"]):
            p.copy_(saved)
    opt = MAKERS[name](_groups(params))
    opt.load_state_dict(record["state_dict"])
    if record["diagnostics_state_dict"]:
        opt.load_diagnostics_state_dict(record["diagnostics_state_dict"])
    for t in range(3, 5):
        for p, g in zip(params, grads_of(t)):
            p.grad = g
        opt.step()
    moved = max(float((a - b).abs().max()) for a, b in zip(record["params_after"], record["params"]))
    assert moved > 1e-3  # the replayed steps are steps
    for got, want in zip(params, record["params_after"]):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-14)
    assert {i: set(s) for i, s in opt.state_dict()["state"].items()} == \
        {i: set(s) for i, s in record["state_dict"]["state"].items()}  # today's state_dict: the same keys
    if hasattr(opt, "diagnostics") and record["diagnostics_state_dict"]:
        assert all(float(v) == float(v) for v in opt.diagnostics().values())  # a cosine right after the restore
