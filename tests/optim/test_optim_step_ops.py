"""What one step dispatches, counted with torch.profiler on CPU (the proxy for GPU kernel launches and host syncs):
the ops the orthogonal step adds over torch's AdamW do not grow with the number of parameter tensors, and no op
reads a value back to the host. Also what the flat scratch buffer must not change: a changing set of parameters
with gradients, checkpoints of EMAs that own their memory."""

import io

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from raystream.optim import Orthogonal, OrthogonalAdamW, OrthogonalSGD, SlowerAdamW

SYNCS = ("aten::item", "aten::_local_scalar_dense")
FUSED_ADAMW = "aten::_fused_adamw_"  # torch's own kernel: on CPU it reads its CPU step counters (on CUDA on device)


def _params(n, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(2 + i % 5, 3 + i % 3, generator=gen).to(dtype)) for i in range(n)]


def _ancestors(event):
    while event is not None:
        yield event.name
        event = event.cpu_parent


def _profile_step(make, n, dtype=torch.float32):
    """(number of aten ops dispatched by step() itself, the sync ops outside torch's fused AdamW kernel) of the
    4th step; ops nested in another aten op (a foreach op's per-tensor loop on CPU) are not counted."""
    params = _params(n, dtype)
    opt = make(params)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            opt.step()
    top, syncs = 0, []
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"):
            top += 1
        if e.name in SYNCS and FUSED_ADAMW not in _ancestors(e):
            syncs.append(" < ".join(_ancestors(e)))
    return top, syncs


MAKERS = {
    "OrthogonalAdamW": lambda projection, diag: (lambda ps: OrthogonalAdamW(ps, projection=projection,
                                                                           diagnostics=diag)),
    "OrthogonalSGD": lambda projection, diag: (lambda ps: OrthogonalSGD(ps, momentum=0.9, projection=projection,
                                                                       diagnostics=diag)),
    "Orthogonal(AdamW fused)": lambda projection, diag: (
        lambda ps: Orthogonal(torch.optim.AdamW(ps, fused=True), projection=projection, diagnostics=diag)),
}
BASELINES = {"OrthogonalAdamW": lambda ps: torch.optim.AdamW(ps, fused=True),
             "OrthogonalSGD": lambda ps: torch.optim.SGD(ps, momentum=0.9, foreach=True),
             "Orthogonal(AdamW fused)": lambda ps: torch.optim.AdamW(ps, fused=True)}


@pytest.mark.parametrize("diagnostics", [False, True])
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
@pytest.mark.parametrize("name", list(MAKERS))
def test_ops_added_over_the_base_do_not_grow_with_the_number_of_tensors(name, projection, diagnostics):
    make = MAKERS[name](projection, diagnostics)
    added = {n: _profile_step(make, n)[0] - _profile_step(BASELINES[name], n)[0] for n in (10, 100)}
    assert added[10] == added[100], added
    assert added[10] <= (50 if diagnostics else 25), added


@pytest.mark.parametrize("diagnostics", [False, True])
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
@pytest.mark.parametrize("name", list(MAKERS))
def test_no_host_sync_inside_step(name, projection, diagnostics):
    _, syncs = _profile_step(MAKERS[name](projection, diagnostics), 12)
    assert syncs == []


@pytest.mark.parametrize("make", [
    lambda ps: OrthogonalAdamW(ps, projection="dim0", diagnostics=True),
    lambda ps: SlowerAdamW(ps, diagnostics=True),
], ids=["dim0", "SlowerAdamW"])
def test_no_host_sync_on_the_other_paths(make):
    _, syncs = _profile_step(make, 6)
    assert syncs == []


def test_no_host_sync_with_bf16_parameters():
    _, syncs = _profile_step(lambda ps: OrthogonalAdamW(ps, diagnostics=True), 6, dtype=torch.bfloat16)
    assert syncs == []


def test_fused_false_adds_no_more_ops_per_tensor_than_torch_foreach_adamw_needs():
    make = lambda ps: OrthogonalAdamW(ps, fused=False)  # noqa: E731
    base = lambda ps: torch.optim.AdamW(ps, foreach=True)  # noqa: E731
    growth = [_profile_step(m, 100)[0] - _profile_step(m, 10)[0] for m in (make, base)]
    assert growth[0] <= growth[1], growth


def test_diagnostics_are_device_tensors_until_read():
    params = _params(3)
    opt = OrthogonalAdamW(params, diagnostics=True)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape)
        opt.step()
    values = opt.diagnostics()
    assert all(torch.is_tensor(v) and v.dim() == 0 for v in values.values())
    assert all(0.0 <= float(values[k]) <= 1.0 + 1e-6 for k in ("update_norm_ratio",))


def test_a_changing_set_of_parameters_with_gradients_matches_the_reference_path():
    """Parameters without a gradient on some steps: the scratch buffer is laid out anew and every EMA is kept."""
    runs = []
    for kw in [dict(), dict(foreach=False)]:
        params = _params(5, torch.float64)
        opt = OrthogonalAdamW(params, lr=0.05, **kw)
        gen = torch.Generator().manual_seed(3)
        for t in range(6):
            for i, p in enumerate(params):
                g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
                p.grad = None if (t in (2, 3) and i % 2) else g
            opt.step()
        runs.append((params, [opt.state[p]["orth_ema"] for p in params]))
    (p1, c1), (p2, c2) = runs
    for a, b in zip(p1 + c1, p2 + c2):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-12)


def test_checkpoint_holds_each_ema_and_not_the_scratch_row():
    params = _params(4)
    for opt in (OrthogonalAdamW(params), Orthogonal(torch.optim.AdamW(params))):
        for _ in range(2):
            for p in params:
                p.grad = torch.randn(p.shape)
            opt.step()
        state = [t for s in opt.state_dict()["state"].values() for t in s.values()]
        assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in state)  # no views
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        buf.seek(0)
        saved = torch.load(buf)["state"]
        for i, p in enumerate(params):
            torch.testing.assert_close(saved[i]["orth_ema"], opt.state[p]["orth_ema"], rtol=0, atol=0)
