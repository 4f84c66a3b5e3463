"""Attentive probe: a learnable query finds the informative token among distractors; chance on random labels."""

import pytest
import torch

from raystream.eval import attentive_probe_top1


def _tokens(n=240, length=16, dim=32, classes=3, seed=0):
    """One token per clip, at a random place, carries the class; the others (and the mean) are noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    tokens = torch.randn(n, length, dim, generator=g)
    codes = torch.randn(classes, dim, generator=g) * 3
    codes[:, 0] = 8.0  # a marker channel lets the query find the token
    where = torch.randint(0, length, (n,), generator=g)
    tokens[torch.arange(n), where] = codes[y] + 0.3 * torch.randn(n, dim, generator=g)
    return tokens, y


def test_finds_the_informative_token():
    x, y = _tokens()
    acc = attentive_probe_top1(x[:160], y[:160], x[160:], y[160:], 3, epochs=25, lr=3e-3, batch_size=32)
    assert acc > 0.9


def test_iterations_override_epochs():
    x, y = _tokens()
    args = dict(epochs=100, lr=3e-3, batch_size=32)  # 100 epochs would learn the task
    assert attentive_probe_top1(x[:160], y[:160], x[160:], y[160:], 3, iterations=1, **args) < 0.6
    assert attentive_probe_top1(x[:160], y[:160], x[160:], y[160:], 3, iterations=125, **args) > 0.9


def test_random_labels_give_chance():
    x, _ = _tokens(n=600)
    y = torch.randint(0, 3, (600,), generator=torch.Generator().manual_seed(5))
    acc = attentive_probe_top1(x[:300], y[:300], x[300:], y[300:], 3, epochs=5, batch_size=64)
    assert abs(acc - 1 / 3) < 0.09


def test_needs_token_sequences():
    with pytest.raises(ValueError, match=r"\(N, L, D\)"):
        attentive_probe_top1(torch.randn(4, 8), torch.zeros(4), torch.randn(4, 8), torch.zeros(4))
