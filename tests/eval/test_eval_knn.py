"""kNN on frozen features: DINO's weighted vote, separable features, chance on random labels."""

import math

import torch

from raystream.eval import knn_top1
from raystream.eval.knn import knn_predict


def _blobs(n_per_class=60, classes=5, dim=32, spread=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g)
    y = torch.arange(classes).repeat_interleave(n_per_class)
    x = centres[y] + spread * torch.randn(len(y), dim, generator=g)
    return x, y


def test_separable_features_are_classified():
    x, y = _blobs()
    assert knn_top1(x[::2], y[::2], x[1::2], y[1::2]) > 0.97


def test_random_labels_give_chance():
    x, y = _blobs(n_per_class=200, classes=5)
    y_rand = torch.randint(0, 5, y.shape, generator=torch.Generator().manual_seed(1))
    acc = knn_top1(x[::2], y_rand[::2], x[1::2], y_rand[1::2], num_classes=5)
    assert abs(acc - 0.2) < 0.06


def test_votes_are_weighted_by_exp_similarity_over_temperature():
    # two neighbours of class 1 at cos 0.6, one of class 0 at cos 1.0: counting would say 1,
    # exp(1/0.07) > 2 exp(0.6/0.07) says 0; with a high temperature the majority wins again
    c = math.sqrt(1 - 0.6 ** 2)
    train = torch.tensor([[1.0, 0.0, 0.0], [0.6, c, 0.0], [0.6, -c, 0.0]])
    labels = torch.tensor([0, 1, 1])
    test = torch.tensor([[2.0, 0.0, 0.0]])  # not unit length: features are normalised
    assert knn_predict(train, labels, test, 2, k=3, temperature=0.07).tolist() == [0]
    assert knn_predict(train, labels, test, 2, k=3, temperature=10.0).tolist() == [1]
    assert knn_predict(train, labels, test, 2, k=1).tolist() == [0]
