"""DINO's projection head: an MLP to a bottleneck, L2 normalisation, and a weight-normalised last layer.

Parameter names follow DINO's `DINOHead` (`mlp.0.weight`, ..., `last_layer.weight_g`, `last_layer.weight_v`, the
names `torch.nn.utils.weight_norm` gave), so a DINO/DoRA head state dict loads as is. With `norm_last_layer` the
gain `weight_g` stays at 1 (not trained): every output unit is a unit-norm direction, which DINO found stabilises
training. `freeze_last_layer` multiplies the last layer's gradient by zero (DINO's `cancel_gradients_last_layer`)
without taking it out of the graph, so DDP still sees a gradient for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class WeightNormLinear(nn.Module):
    """y = x W^T with W = g * V / ||V|| row-wise, no bias (`nn.utils.weight_norm(nn.Linear(..., bias=False))`)."""

    def __init__(self, in_dim: int, out_dim: int, train_gain: bool = False):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_dim, in_dim))
        nn.init.trunc_normal_(self.weight_v, std=0.02)
        self.weight_g = nn.Parameter(torch.ones(out_dim, 1), requires_grad=train_gain)

    def forward(self, x: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        v = self.weight_v
        if frozen:  # zero gradient, but the parameter stays in the graph (DDP expects a gradient for it)
            v = v.detach() + 0.0 * v
        weight = self.weight_g * v / v.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return F.linear(x, weight)


class DINOHead(nn.Module):
    """`in_dim` -> MLP (`layers` linear layers, GELU, hidden `hidden_dim`) -> `bottleneck_dim` -> L2 norm ->
    weight-normalised linear -> `out_dim` logits."""

    def __init__(self, in_dim: int, out_dim: int, *, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 layers: int = 3, norm_last_layer: bool = True):
        super().__init__()
        layers = max(int(layers), 1)
        if layers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            mods = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
            for _ in range(layers - 2):
                mods += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
            mods.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*mods)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim, train_gain=not norm_last_layer)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor, freeze_last_layer: bool = False) -> torch.Tensor:
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(x, frozen=freeze_last_layer)
