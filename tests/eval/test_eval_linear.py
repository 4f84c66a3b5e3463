"""Linear probe on cached features: high accuracy when separable, chance on random labels."""

import pytest
import torch

from raystream.eval import linear_probe_top1


def _linear_data(n=1000, dim=10, classes=4, seed=0, margin=2.0):
    """Labels from a random linear map, keeping only points at least `margin` from a decision boundary."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4 * n, dim, generator=g) * 3 + 1
    top2 = (x @ torch.randn(dim, classes, generator=g)).topk(2, dim=1)
    keep = (top2.values[:, 0] - top2.values[:, 1] > margin).nonzero()[:n, 0]
    assert len(keep) == n
    return x[keep], top2.indices[keep, 0]


@pytest.mark.parametrize("optimizer", ["lbfgs", "sgd", "adamw"])
def test_linearly_separable_features(optimizer):
    x, y = _linear_data()
    acc = linear_probe_top1(x[:700], y[:700], x[700:], y[700:], 4, optimizer=optimizer,
                            epochs=100 if optimizer == "lbfgs" else 30, weight_decay=0.0,
                            lr=0.1 if optimizer == "adamw" else None)
    assert acc > 0.95


@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.01), ("adamw", 3e-2)])
def test_mini_batch_probe_runs_exactly_the_given_iterations(optimizer, lr):
    x, y = _linear_data()
    args = dict(optimizer=optimizer, lr=lr, batch_size=32, weight_decay=0.0, seed=1)
    one = linear_probe_top1(x[:700], y[:700], x[700:], y[700:], 4, iterations=1, **args)
    many = linear_probe_top1(x[:700], y[:700], x[700:], y[700:], 4, iterations=400, **args)
    epochs = linear_probe_top1(x[:700], y[:700], x[700:], y[700:], 4, epochs=1, **args)  # 22 mini-batches
    assert one < 0.6 < epochs and many > 0.95


def test_random_labels_give_chance():
    x, _ = _linear_data(n=1200)
    y = torch.randint(0, 4, (1200,), generator=torch.Generator().manual_seed(3))
    acc = linear_probe_top1(x[:600], y[:600], x[600:], y[600:], 4)
    assert abs(acc - 0.25) < 0.07


def test_bad_arguments():
    x, y = _linear_data(n=10)
    with pytest.raises(ValueError, match="linear_optimizer"):
        linear_probe_top1(x, y, x, y, optimizer="adam")
    with pytest.raises(ValueError, match="labels"):
        linear_probe_top1(x, y[:5], x, y)
