"""The optimizers against the independent reference (optim_reference.py) on a correlated gradient sequence:
several tensors in two param groups with their own lr / weight_decay / orth_beta, every projection scope, both
EMA initialisations, orth_beta 0 and 0.9, every implementation path."""

import warnings

import pytest
import torch

from optim_reference import ReferenceOptimizer, correlated_gradients
from raystream.optim import Orthogonal, OrthogonalAdamW, OrthogonalSGD

SHAPES = [(6, 4), (4,), (3, 2, 2), (5, 3)]
STEPS = 6


def _hp(beta, lr0=0.05, lr1=0.02, wd0=0.1, wd1=0.0):
    g0 = dict(lr=lr0, weight_decay=wd0, orth_beta=beta, betas=(0.9, 0.999), eps=1e-8)
    g1 = dict(lr=lr1, weight_decay=wd1, orth_beta=beta / 2, betas=(0.8, 0.99), eps=1e-8)
    return g0, g1


def _run(make, beta, grads_seq, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in SHAPES]
    g0, g1 = _hp(beta)
    groups = [dict(params=params[:2], **g0), dict(params=params[2:], **g1)]
    opt = make(groups)
    ref = ReferenceOptimizer(params, [g0, g0, g1, g1], opt.projection, opt.orth_init,
                             "sgd" if isinstance(opt, OrthogonalSGD) else "adamw")
    for grads in grads_seq:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        ref.step(grads)
    return params, ref.params


PATHS = {"fused": dict(), "foreach": dict(fused=False), "single": dict(foreach=False)}


@pytest.mark.parametrize("projection", ["global", "per_tensor", "dim0"])
@pytest.mark.parametrize("beta", [0.0, 0.9])
@pytest.mark.parametrize("orth_init", ["zero", "first_grad"])
@pytest.mark.parametrize("path", list(PATHS))
def test_orthogonal_adamw_matches_algorithm_2(projection, beta, orth_init, path):
    seq = correlated_gradients(SHAPES, STEPS)
    got, want = _run(lambda g: OrthogonalAdamW(g, projection=projection, orth_init=orth_init, **PATHS[path]),
                     beta, seq)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.detach(), b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("projection", ["global", "per_tensor", "dim0"])
@pytest.mark.parametrize("beta", [0.0, 0.9])
@pytest.mark.parametrize("foreach", [True, False])
def test_orthogonal_sgd_matches_algorithm_1(projection, beta, foreach):
    seq = correlated_gradients(SHAPES, STEPS, seed=1)
    got, want = _run(lambda g: OrthogonalSGD(g, projection=projection, foreach=foreach), beta, seq)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("projection", ["global", "per_tensor", "dim0"])
@pytest.mark.parametrize("orth_init", ["zero", "first_grad"])
def test_wrapper_around_torch_adamw_matches_algorithm_2(projection, orth_init):
    seq = correlated_gradients(SHAPES, STEPS, seed=2)

    def make(groups):
        base = torch.optim.AdamW([dict(g) for g in groups], lr=1.0, foreach=False)
        return Orthogonal(base, projection=projection, orth_init=orth_init)

    got, want = _run(make, 0.9, seq)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.detach(), b, rtol=1e-9, atol=1e-11)


def test_the_reference_is_not_plain_adamw():
    """Guard against a reference that silently ignores the projection: it must differ from AdamW."""
    seq = correlated_gradients(SHAPES, STEPS)
    _, want = _run(lambda g: OrthogonalAdamW(g), 0.9, seq)
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in SHAPES]
    g0, g1 = _hp(0.9)
    drop = ("orth_beta",)
    adamw = torch.optim.AdamW([dict(params=params[:2], **{k: v for k, v in g0.items() if k not in drop}),
                               dict(params=params[2:], **{k: v for k, v in g1.items() if k not in drop})])
    for grads in seq:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        adamw.step()
    assert max((a - b).abs().max().item() for a, b in zip(params, want)) > 1e-4


def test_dim0_zeroes_first_dimension_one_and_warns():
    """The published code's per-slice projection: a [1, N] tensor (cls_token-like) gets u = 0 from step 2 on."""
    cls = torch.nn.Parameter(torch.randn(1, 5, dtype=torch.float64))
    w = torch.nn.Parameter(torch.randn(4, 5, dtype=torch.float64))
    with pytest.warns(UserWarning, match="first dimension 1"):
        opt = OrthogonalSGD([cls, w], lr=0.1, projection="dim0", orth_init="first_grad")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OrthogonalSGD([w], lr=0.1, projection="dim0")  # no warning without such parameters
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        before = cls.detach().clone()
        cls.grad = torch.randn(cls.shape, generator=gen, dtype=torch.float64)
        w.grad = torch.randn(w.shape, generator=gen, dtype=torch.float64)
        opt.step()
        moved = (cls.detach() - before).abs().max().item()
        assert (moved > 1e-3) if step == 0 else (moved < 1e-12)
