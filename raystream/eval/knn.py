"""Weighted k-nearest-neighbour classification on frozen features, as DINO's `eval_knn.py` (and DoRA's).

Features are L2-normalised; each test sample takes its k most cosine-similar training samples, and each neighbour
votes for its label with weight exp(similarity / T). Defaults k = 20, T = 0.07.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from raystream.eval.shard import Shard


@torch.no_grad()
def knn_predict(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor,
                num_classes: Optional[int] = None, *, k: int = 20, temperature: float = 0.07,
                chunk: int = 1024) -> torch.Tensor:
    """Predicted labels (N_test,) of the weighted kNN vote."""
    if train_features.shape[0] != train_labels.shape[0]:
        raise ValueError(f"{train_features.shape[0]} training features but {train_labels.shape[0]} labels")
    if k < 1 or temperature <= 0:
        raise ValueError(f"kNN needs k >= 1 and temperature > 0, got k={k}, temperature={temperature}")
    train = F.normalize(train_features.float(), dim=1)
    test = F.normalize(test_features.float().to(train.device), dim=1)
    labels = train_labels.long().to(train.device)
    classes = int(num_classes) if num_classes is not None else int(labels.max()) + 1
    k = min(k, train.shape[0])
    preds = []
    for start in range(0, test.shape[0], chunk):
        sim, idx = (test[start:start + chunk] @ train.T).topk(k, dim=1)
        votes = torch.zeros(sim.shape[0], classes, device=train.device)
        votes.scatter_add_(1, labels[idx], (sim / temperature).exp())
        preds.append(votes.argmax(dim=1))
    return torch.cat(preds) if preds else torch.empty(0, dtype=torch.long)


def knn_top1(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor,
             test_labels: torch.Tensor, num_classes: Optional[int] = None, *, k: int = 20,
             temperature: float = 0.07, shard: Shard = Shard()) -> float:
    """Top-1 accuracy in [0, 1] of the weighted kNN classifier; with a `shard`, each rank classifies its part of the
    test set (in chunks, on the features' device)."""
    classes = int(num_classes) if num_classes is not None else int(train_labels.max()) + 1
    return shard.accuracy(lambda test: knn_predict(train_features, train_labels, test, classes, k=k,
                                                   temperature=temperature), test_features, test_labels)
