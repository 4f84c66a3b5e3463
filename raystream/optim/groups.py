"""param_groups: a model's trainable parameters as the two param groups DINO and VideoMAE train with.

Weight decay pulls weights towards 0; for biases, norm scales/shifts (any tensor with ndim <= 1) and the ViT's
learned tokens and position embeddings (`cls_token`, `mask_token`, `pos_embed`, ...) that only distorts them, so
DINO (`utils.get_params_groups`) and VideoMAE (`no_weight_decay()` + `skip_list`) put them in a group with weight
decay 0. `optimizer.no_decay_1d=false` keeps every parameter in one decayed group.

The groups carry `decay` (True / False) so that a weight-decay schedule (raystream/train/schedule.py) moves the
decayed group only. The orthogonal optimizers project over ALL groups together when `projection="global"`, so
splitting the parameters changes the weight decay, never the projection.
"""

from __future__ import annotations

from typing import Any, Dict, List

from torch import Tensor, nn

from raystream.optim.config import OptimizerConfig

TOKEN_SUFFIX = "token"  # cls_token, mask_token, dist_token, reg_token
POS_EMBED_PREFIX = "pos_embed"


def decays(name: str, param: Tensor) -> bool:
    """Whether parameter `name` (as in `named_parameters()`) gets weight decay under the DINO/VideoMAE rule."""
    leaf = name.rsplit(".", 1)[-1]
    return not (param.ndim <= 1 or leaf.endswith(TOKEN_SUFFIX) or leaf.startswith(POS_EMBED_PREFIX))


def param_groups(model: nn.Module, cfg: OptimizerConfig) -> List[Dict[str, Any]]:
    """The trainable parameters of `model` as param-group dicts for `build_optimizer`.

    `cfg`: the `optimizer` section; reads `weight_decay` and `no_decay_1d`. Returns the
    decayed group `{'params', 'weight_decay': cfg.weight_decay, 'decay': True}` and, when `no_decay_1d`, the
    `{'params', 'weight_decay': 0.0, 'decay': False}` group; an empty group is left out.
    """
    split = cfg.no_decay_1d
    decayed: List[Tensor] = []
    kept: List[Tensor] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decayed if not split or decays(name, param) else kept).append(param)
    groups = []
    if decayed:
        groups.append({"params": decayed, "weight_decay": cfg.weight_decay, "decay": True})
    if kept:
        groups.append({"params": kept, "weight_decay": 0.0, "decay": False})
    return groups
