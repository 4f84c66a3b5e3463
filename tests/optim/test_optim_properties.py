"""Properties of the projection (hypothesis) and the behaviours that distinguish the method from its base."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from raystream.optim import OrthogonalAdamW, OrthogonalSGD, project

SHAPE_SETS = [[(3,)], [(2, 3), (4,)], [(3, 2), (2, 2, 2), (1, 3)]]
finite = st.floats(-100, 100, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def grad_ema_pairs(draw):
    shapes = draw(st.sampled_from(SHAPE_SETS))
    gs = [torch.from_numpy(draw(hnp.arrays(np.float64, s, elements=finite))) for s in shapes]
    cs = [torch.from_numpy(draw(hnp.arrays(np.float64, s, elements=finite))) for s in shapes]
    return gs, cs


def _flat(ts):
    return torch.cat([t.flatten() for t in ts])


@settings(max_examples=60, deadline=None)
@given(grad_ema_pairs(), st.sampled_from(["global", "per_tensor"]))
def test_u_is_orthogonal_to_c_and_no_longer_than_g(pair, projection):
    gs, cs = pair
    u = project(gs, cs, projection)
    scopes = [(u, gs, cs)] if projection == "global" else [([a], [b], [c]) for a, b, c in zip(u, gs, cs)]
    for us, g, c in scopes:
        U, G, C = _flat(us), _flat(g), _flat(c)
        assert abs(float(U @ C)) <= 1e-9 * (float(G.norm()) * float(C.norm()) + 1e-300) + 1e-12
        assert float(U.norm()) <= float(G.norm()) * (1 + 1e-12) + 1e-12


@settings(max_examples=60, deadline=None)
@given(grad_ema_pairs(), st.sampled_from(["global", "per_tensor", "dim0"]))
def test_u_equals_g_when_g_is_orthogonal_to_c(pair, projection):
    gs, cs = pair
    cs = [torch.where(g != 0, torch.zeros_like(c), c) for g, c in zip(gs, cs)]  # disjoint support: g . c = 0
    for a, b in zip(project(gs, cs, projection), gs):
        assert torch.equal(a, b)


@settings(max_examples=40, deadline=None)
@given(grad_ema_pairs())
def test_dim0_each_slice_is_orthogonal_to_its_ema_slice(pair):
    gs, cs = pair
    for u, g, c in zip(project(gs, cs, "dim0"), gs, cs):
        U, G, C = (t.reshape(t.shape[0], -1) for t in (u, g, c))
        ok = (G.norm(dim=0) > 1e-6) & (C.norm(dim=0) > 1e-6)
        dots = (U * C).sum(0)[ok]
        assert torch.all(dots.abs() <= 1e-9 * (G.norm(dim=0) * C.norm(dim=0))[ok] + 1e-12)


def test_missing_ema_leaves_the_gradient_itself():
    g = [torch.randn(3, 2)]
    assert project(g, [None])[0] is g[0]
    assert torch.equal(project(g, [torch.zeros(3, 2)])[0], g[0])


@pytest.mark.parametrize("orth_init", ["zero", "first_grad"])
def test_identical_gradients_stop_orthogonal_sgd_but_not_sgd(orth_init):
    """With the same gradient every step, u_t = 0 from step 2 on: the orthogonal optimizer stops, SGD does not."""
    g = torch.randn(4, 3)
    p_orth, p_sgd = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4, 3))
    orth = OrthogonalSGD([p_orth], lr=0.1, orth_init=orth_init)
    sgd = torch.optim.SGD([p_sgd], lr=0.1)
    for step in range(4):
        before_o, before_s = p_orth.detach().clone(), p_sgd.detach().clone()
        p_orth.grad, p_sgd.grad = g.clone(), g.clone()
        orth.step()
        sgd.step()
        assert (p_sgd.detach() - before_s).norm() > 1e-3
        moved = (p_orth.detach() - before_o).norm()
        assert (moved > 1e-3) if step == 0 else (moved < 1e-6)


def test_identical_gradients_make_u_vanish_for_adamw_while_adamw_keeps_moving():
    g = torch.randn(5, 2)
    p_orth, p_adam = torch.nn.Parameter(torch.zeros(5, 2)), torch.nn.Parameter(torch.zeros(5, 2))
    orth = OrthogonalAdamW([p_orth], lr=0.01, weight_decay=0.0, diagnostics=True)
    adam = torch.optim.AdamW([p_adam], lr=0.01, weight_decay=0.0)
    for step in range(5):
        p_orth.grad, p_adam.grad = g.clone(), g.clone()
        before = p_adam.detach().clone()
        orth.step()
        adam.step()
        ratio = orth.diagnostics()["update_norm_ratio"]
        assert ratio == pytest.approx(1.0) if step == 0 else ratio < 1e-6
        assert (p_adam.detach() - before).norm() > 1e-3
    # with u = 0 only Adam's decaying first moment moves the parameter; AdamW's steps do not shrink
    assert p_orth.detach().norm() < p_adam.detach().norm()


def test_orth_beta_zero_projects_against_the_previous_gradient_only():
    g1, g2 = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    p = torch.nn.Parameter(torch.zeros(3))
    opt = OrthogonalSGD([p], lr=1.0, orth_beta=0.0)
    p.grad = g1.clone()
    opt.step()
    p.grad = g2.clone()
    before = p.detach().clone()
    opt.step()
    torch.testing.assert_close(before - p.detach(), torch.tensor([0.0, 1.0, 0.0]))  # u_2 = g2 - (g2.g1) g1


def test_global_and_per_tensor_differ():
    gs = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])]
    cs = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])]
    glob, per = project(gs, cs, "global"), project(gs, cs, "per_tensor")
    # global: k = (g.c)/(c.c) = 1/2 over the joint vector; per tensor: k = 1 for the first, 0 for the second
    torch.testing.assert_close(glob[0], torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(glob[1], torch.tensor([-0.5, 1.0]))
    torch.testing.assert_close(per[0], torch.tensor([0.0, 0.0]))
    torch.testing.assert_close(per[1], torch.tensor([0.0, 1.0]))
    assert math.isclose(float(_flat(glob) @ _flat(cs)), 0.0, abs_tol=1e-7)
