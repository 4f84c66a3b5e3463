"""torch.optim conventions and the pitfalls other implementations fell into: closure order, step hooks, EMA in
the per-parameter state, fp32 EMA of bf16 parameters across load_state_dict, p.grad restored, GradScaler,
clip_grad_norm_, maximize, sparse gradients, hyper-parameter validation, one extra buffer per parameter."""

import io
import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from raystream.optim import GradCosineTracker, Orthogonal, OrthogonalAdamW, OrthogonalSGD, SlowerAdamW

MAKERS = {
    "OrthogonalAdamW": lambda ps: OrthogonalAdamW(ps, lr=0.01, weight_decay=0.1),
    "OrthogonalAdamW-single": lambda ps: OrthogonalAdamW(ps, lr=0.01, foreach=False),
    "OrthogonalSGD": lambda ps: OrthogonalSGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01),
    "Orthogonal(AdamW)": lambda ps: Orthogonal(torch.optim.AdamW(ps, lr=0.01, foreach=True)),
    "Orthogonal(SGD)": lambda ps: Orthogonal(torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True,
                                                             foreach=True)),
    "SlowerAdamW": lambda ps: SlowerAdamW(ps, lr=0.01),
}


def _model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).to(dtype)


def _batch(t, dtype=torch.float32):
    gen = torch.Generator().manual_seed(100 + t)
    return torch.randn(8, 4, generator=gen).to(dtype), torch.randn(8, 2, generator=gen).to(dtype)


def _loss(model, t):
    x, y = _batch(t, next(model.parameters()).dtype)
    return ((model(x) - y) ** 2).mean()


def _train(model, opt, steps, start=0):
    for t in range(start, start + steps):
        opt.zero_grad()
        _loss(model, t).backward()
        opt.step()


@pytest.mark.parametrize("name", list(MAKERS))
def test_state_dict_round_trip_continues_the_same_trajectory(name):
    model = _model()
    opt = MAKERS[name](model.parameters())
    _train(model, opt, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    _train(model, opt, 3, start=3)
    buf.seek(0)
    saved = torch.load(buf)
    fresh = _model(seed=1)
    fresh.load_state_dict(saved["model"])
    opt2 = MAKERS[name](fresh.parameters())
    opt2.load_state_dict(saved["opt"])
    _train(fresh, opt2, 3, start=3)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("wrap", [False, True])
def test_fp32_ema_of_bf16_params_survives_load_state_dict(wrap):
    model = _model(dtype=torch.bfloat16)
    make = (lambda ps: Orthogonal(torch.optim.AdamW(ps, lr=0.01))) if wrap else \
        (lambda ps: OrthogonalAdamW(ps, lr=0.01))
    opt = make(model.parameters())
    _train(model, opt, 2)
    saved = opt.state_dict()
    emas = [opt.state[p]["orth_ema"].clone() for p in model.parameters()]
    assert all(c.dtype == torch.float32 for c in emas)
    opt2 = make(model.parameters())
    opt2.load_state_dict(saved)
    for p, c in zip(model.parameters(), emas):
        assert opt2.state[p]["orth_ema"].dtype == torch.float32
        assert torch.equal(opt2.state[p]["orth_ema"], c)
    # what the fix undoes: torch's own load_state_dict casts the EMA to the parameter's bf16
    plain = torch.optim.AdamW(model.parameters(), lr=0.01)
    plain.load_state_dict(saved)
    assert next(iter(plain.state.values()))["orth_ema"].dtype == torch.bfloat16


def test_ema_lives_in_the_base_state_and_round_trips_through_the_base():
    model = _model()
    base = torch.optim.AdamW(model.parameters(), lr=0.01)
    opt = Orthogonal(base)
    _train(model, opt, 2)
    assert all("orth_ema" in base.state[p] for p in model.parameters())
    assert opt.state_dict()["state"][0].keys() == base.state_dict()["state"][0].keys()


@pytest.mark.parametrize("name", ["OrthogonalAdamW", "Orthogonal(AdamW)"])
def test_closure_is_evaluated_before_the_projection(name):
    """A wrapper that lets the base evaluate the closure after projecting would lose the projection."""
    m1, m2 = _model(), _model()
    o1, o2 = MAKERS[name](m1.parameters()), MAKERS[name](m2.parameters())
    for t in range(3):
        o1.zero_grad()
        _loss(m1, t).backward()
        o1.step()
        for p in m2.parameters():  # stale garbage that the closure must replace
            p.grad = torch.full_like(p, 123.0)

        def closure(t=t):
            o2.zero_grad()
            loss = _loss(m2, t)
            loss.backward()
            return loss

        loss = o2.step(closure)
        assert torch.is_tensor(loss)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(MAKERS))
def test_step_hooks_fire(name):
    model = _model()
    opt = MAKERS[name](model.parameters())
    calls = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))
    handle = register_optimizer_step_post_hook(lambda o, a, k: calls.append("global"))
    try:
        _train(model, opt, 1)
    finally:
        handle.remove()
    assert calls[0] == "pre" and calls.count("pre") == calls.count("post") == 1
    assert "global" in calls  # a wrapper's base also fires the global hooks from its own step


@pytest.mark.parametrize("name", list(MAKERS))
def test_p_grad_holds_the_raw_gradient_after_the_step(name):
    model = _model()
    opt = MAKERS[name](model.parameters())
    for t in range(3):
        opt.zero_grad()
        _loss(model, t).backward()
        raw = [p.grad for p in model.parameters()]
        copies = [g.clone() for g in raw]
        opt.step()
        for p, g, c in zip(model.parameters(), raw, copies):
            assert p.grad is g and torch.equal(g, c)


def test_wrapper_matches_orthogonal_adamw_and_orthogonal_sgd():
    for make_a, make_b in [
        (lambda ps: OrthogonalAdamW(ps, lr=0.01, weight_decay=0.1, projection="per_tensor"),
         lambda ps: Orthogonal(torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1), projection="per_tensor")),
        (lambda ps: OrthogonalSGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01),
         lambda ps: Orthogonal(torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01))),
    ]:
        m1, m2 = _model(), _model()
        _train(m1, make_a(m1.parameters()), 4)
        _train(m2, make_b(m2.parameters()), 4)
        for a, b in zip(m1.parameters(), m2.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("projection", ["global", "per_tensor", "dim0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fused_foreach_and_single_tensor_paths_agree(projection, dtype):
    results = []
    for kw in [dict(), dict(fused=False), dict(foreach=False)]:
        model = _model(dtype=dtype)
        opt = OrthogonalAdamW(model.parameters(), lr=0.01, weight_decay=0.1, projection=projection, **kw)
        _train(model, opt, 4)
        results.append([p.detach().float() for p in model.parameters()])
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("name", ["OrthogonalAdamW", "OrthogonalSGD"])
def test_maximize_equals_minimizing_the_negated_gradient(name):
    make = MAKERS[name]
    p1, p2 = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(3, 2))
    o1 = make([p1])
    o2 = make([p2])
    for group in o1.param_groups:
        group["maximize"] = True
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        g = torch.randn(3, 2, generator=gen)
        p1.grad, p2.grad = g.clone(), -g
        o1.step()
        o2.step()
    torch.testing.assert_close(p1, p2)


def test_grad_scaler_unscales_and_skips_inf_steps():
    m1, m2 = _model(), _model()
    o1, o2 = OrthogonalAdamW(m1.parameters(), lr=0.01), OrthogonalAdamW(m2.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    for t in range(3):
        o1.zero_grad()
        _loss(m1, t).backward()
        o1.step()
        o2.zero_grad()
        scaler.scale(_loss(m2, t)).backward()
        scaler.step(o2)
        scaler.update()
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    before = [p.detach().clone() for p in m2.parameters()]
    emas = [o2.state[p]["orth_ema"].clone() for p in m2.parameters()]
    o2.zero_grad()
    scaler.scale(_loss(m2, 9)).backward()
    next(m2.parameters()).grad[0, 0] = float("inf")
    scaler.step(o2)
    scaler.update()
    for p, b, c in zip(m2.parameters(), before, emas):
        assert torch.equal(p, b) and torch.equal(o2.state[p]["orth_ema"], c)


def test_clip_grad_norm_before_the_step_is_what_gets_projected():
    m1, m2 = _model(), _model()
    o1, o2 = OrthogonalAdamW(m1.parameters(), lr=0.01), OrthogonalAdamW(m2.parameters(), lr=0.01)
    for t in range(3):
        o1.zero_grad()
        _loss(m1, t).backward()
        torch.nn.utils.clip_grad_norm_(m1.parameters(), 0.05)
        o1.step()
        o2.zero_grad()
        _loss(m2, t).backward()
        norm = torch.cat([p.grad.flatten() for p in m2.parameters()]).norm()
        for p in m2.parameters():
            p.grad.mul_(min(1.0, 0.05 / (float(norm) + 1e-6)))
        o2.step()
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["OrthogonalAdamW", "OrthogonalSGD", "Orthogonal(AdamW)", "SlowerAdamW"])
def test_sparse_gradients_are_rejected(name):
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = MAKERS[name](emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


def test_params_without_grad_are_skipped_and_get_no_state():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = OrthogonalAdamW([a, b], lr=0.1)
    a.grad = torch.ones(2)
    opt.step()
    assert torch.equal(b, torch.ones(2)) and len(opt.state[b]) == 0 and not torch.equal(a, torch.ones(2))


@pytest.mark.parametrize("make, name", [
    (lambda ps: OrthogonalAdamW(ps, lr=-1.0), "lr"),
    (lambda ps: OrthogonalAdamW(ps, eps=-1e-8), "eps"),
    (lambda ps: OrthogonalAdamW(ps, weight_decay=-0.1), "weight_decay"),
    (lambda ps: OrthogonalAdamW(ps, betas=(1.0, 0.999)), r"betas\[0\]"),
    (lambda ps: OrthogonalAdamW(ps, orth_beta=1.0), "orth_beta"),
    (lambda ps: OrthogonalAdamW(ps, orth_beta=-0.1), "orth_beta"),
    (lambda ps: OrthogonalAdamW(ps, projection="diagonal"), "projection"),
    (lambda ps: OrthogonalAdamW(ps, orth_init="ones"), "orth_init"),
    (lambda ps: OrthogonalAdamW([dict(params=ps, orth_beta=2.0)]), "orth_beta"),
    (lambda ps: OrthogonalSGD(ps, lr=-0.1), "lr"),
    (lambda ps: OrthogonalSGD(ps, momentum=-0.5), "momentum"),
    (lambda ps: OrthogonalSGD(ps, nesterov=True), "nesterov"),
    (lambda ps: Orthogonal(torch.optim.SGD(ps, lr=0.1), orth_beta=1.5), "orth_beta"),
    (lambda ps: Orthogonal(torch.optim.SGD(ps, lr=0.1), projection="rows"), "projection"),
    (lambda ps: SlowerAdamW(ps, lr=-1.0), "lr"),
])
def test_bad_hyper_parameters_name_the_parameter(make, name):
    with pytest.raises(ValueError, match=name):
        make([torch.nn.Parameter(torch.ones(2))])


def test_wrapper_rejects_non_optimizers_and_double_wrapping():
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(TypeError, match="Optimizer"):
        Orthogonal([p])
    with pytest.raises(ValueError, match="already"):
        Orthogonal(OrthogonalAdamW([p]))


def test_extra_state_is_exactly_one_parameter_sized_buffer():
    m1, m2 = _model(), _model()
    orth, adamw = OrthogonalAdamW(m1.parameters(), lr=0.01), torch.optim.AdamW(m2.parameters(), lr=0.01)
    _train(m1, orth, 2)
    _train(m2, adamw, 2)
    for p, q in zip(m1.parameters(), m2.parameters()):
        extra = set(orth.state[p]) - set(adamw.state[q])
        assert extra == {"orth_ema"} and set(adamw.state[q]) <= set(orth.state[p])
        assert orth.state[p]["orth_ema"].shape == p.shape
        assert orth._cosine is None  # diagnostics off: no gradient copies kept


def test_groups_share_one_lr_truth_with_the_wrapper_and_add_param_group():
    model = _model()
    base = torch.optim.AdamW(model[0].parameters(), lr=0.1, betas=(0.8, 0.9))
    opt = Orthogonal(base, orth_beta=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _train(model, opt, 1)
    sched.step()
    assert base.param_groups[0]["lr"] == pytest.approx(0.05)
    opt.add_param_group({"params": list(model[2].parameters())})
    assert base.param_groups[-1]["betas"] == (0.8, 0.9) and base.param_groups[-1]["orth_beta"] == 0.5
    _train(model, opt, 1, start=1)
    assert all("orth_ema" in base.state[p] for p in model[2].parameters())


def test_reset_orthogonal_state_makes_the_next_step_unprojected():
    p = torch.nn.Parameter(torch.zeros(4))
    opt = OrthogonalAdamW([p], lr=0.1, orth_beta=0.9, diagnostics=True)
    g = torch.tensor([1.0, 2.0, 0.0, -1.0])
    for _ in range(2):
        p.grad = g.clone()
        opt.step()
    assert opt.diagnostics()["update_norm_ratio"] < 1e-6
    opt.reset_orthogonal_state()
    p.grad = g.clone()
    opt.step()
    assert opt.diagnostics()["update_norm_ratio"] == pytest.approx(1.0)
    torch.testing.assert_close(opt.state[p]["orth_ema"], 0.1 * g)


def test_diagnostics_values_and_their_absence_when_disabled():
    gen = torch.Generator().manual_seed(0)
    g1, g2 = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    p = torch.nn.Parameter(torch.zeros(6))
    opt = OrthogonalAdamW([p], lr=0.1, orth_beta=0.9, diagnostics=True)
    assert all(v != v for v in opt.diagnostics().values())  # NaN before any step
    p.grad = g1.clone()
    opt.step()
    d1 = opt.diagnostics()
    assert d1["grad_cos_prev"] != d1["grad_cos_prev"] and d1["update_norm_ratio"] == pytest.approx(1.0)
    p.grad = g2.clone()
    opt.step()
    d = opt.diagnostics()
    cos = float(torch.nn.functional.cosine_similarity(g1, g2, dim=0))
    u = g2 - (g2 @ g1) / (g1 @ g1) * g1
    assert d["grad_cos_prev"] == pytest.approx(cos, abs=1e-6)
    assert d["grad_cos_ema"] == pytest.approx(cos, abs=1e-6)  # c_1 is parallel to g1
    assert d["update_norm_ratio"] == pytest.approx(float(u.norm() / g2.norm()), abs=1e-6)
    off = OrthogonalAdamW([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(RuntimeError, match="diagnostics=True"):
        off.diagnostics()


def test_grad_cosine_tracker():
    p = torch.nn.Parameter(torch.zeros(3))
    tracker = GradCosineTracker([{"params": [p]}])
    p.grad = torch.tensor([1.0, 0.0, 0.0])
    assert math.isnan(tracker.update())  # no previous gradient yet
    p.grad = torch.tensor([1.0, 1.0, 0.0])
    assert tracker.update() == pytest.approx(2 ** -0.5)
    p.grad = torch.tensor([-1.0, -1.0, 0.0])
    assert tracker.update() == pytest.approx(-1.0)


def test_slower_adamw_scales_adamw_by_one_minus_cosine():
    gen = torch.Generator().manual_seed(0)
    g1, g2 = torch.randn(5, generator=gen), torch.randn(5, generator=gen)
    p1, p2 = torch.nn.Parameter(torch.ones(5)), torch.nn.Parameter(torch.ones(5))
    slower = SlowerAdamW([p1], lr=0.1, weight_decay=0.1, diagnostics=True)
    adamw = torch.optim.AdamW([p2], lr=0.1, weight_decay=0.1)
    lam = 1 - float(torch.nn.functional.cosine_similarity(g1, g2, dim=0))
    for g, lr in [(g1, 0.1), (g2, 0.1 * lam)]:
        adamw.param_groups[0]["lr"] = lr
        p1.grad, p2.grad = g.clone(), g.clone()
        slower.step()
        adamw.step()
    torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6)
    assert slower.diagnostics()["update_norm_ratio"] == pytest.approx(lam, abs=1e-6)
    p1.grad = g2.clone()  # the same gradient again: lambda = 0, no step at all
    before = p1.detach().clone()
    slower.step()
    torch.testing.assert_close(p1.detach(), before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_state_dict_loads_into_a_fresh_optimizer_on_another_device():
    model = _model()
    opt = OrthogonalAdamW(model.parameters(), lr=0.01)
    _train(model, opt, 2)
    saved = opt.state_dict()
    cuda = _model().cuda()
    cuda.load_state_dict(model.state_dict())
    opt2 = OrthogonalAdamW(cuda.parameters(), lr=0.01)
    opt2.load_state_dict(saved)
    _train(model, opt, 1, start=2)
    for t in range(2, 3):
        opt2.zero_grad()
        x, y = _batch(t)
        ((cuda(x.cuda()) - y.cuda()) ** 2).mean().backward()
        opt2.step()
    for a, b in zip(model.parameters(), cuda.parameters()):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-4, atol=1e-5)
        assert opt2.state[b]["orth_ema"].device == b.device
