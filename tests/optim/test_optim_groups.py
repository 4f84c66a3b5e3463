"""param_groups: which parameters get weight decay (DINO / VideoMAE rule), and that the split changes the weight
decay only: the orthogonal projection with projection="global" still spans every group."""

import pytest
import torch
from torch import nn

from optim_reference import correlated_gradients
from raystream.optim import build_optimizer, param_groups
from raystream.optim.factory import OptimizerConfig
from raystream.optim.factory import NAMES


class TinyViT(nn.Module):
    """The parameter kinds of a ViT (tokens, position embedding, conv patch embedding, norm, linear) and a frozen
    layer, with random values."""

    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.randn(1, 1, 4))
        self.pos_embed = nn.Parameter(torch.randn(1, 3, 4))
        self.patch_embed = nn.Conv2d(3, 4, 2)
        self.blocks = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 8))
        self.decoder = nn.Module()
        self.decoder.mask_token = nn.Parameter(torch.randn(1, 1, 4))
        self.decoder.head = nn.Linear(8, 2, bias=False)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        with torch.no_grad():
            for p in self.parameters():
                p.normal_()


NOT_DECAYED = {"cls_token", "pos_embed", "patch_embed.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.bias",
               "decoder.mask_token"}
DECAYED = {"patch_embed.weight", "blocks.1.weight", "decoder.head.weight"}


def names_of(model, params):
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_biases_norms_and_vit_tokens_get_no_weight_decay():
    model = TinyViT()
    decayed, kept = param_groups(model, OptimizerConfig(weight_decay=0.04))
    assert names_of(model, decayed["params"]) == DECAYED and (decayed["weight_decay"], decayed["decay"]) == (0.04, True)
    assert names_of(model, kept["params"]) == NOT_DECAYED and (kept["weight_decay"], kept["decay"]) == (0.0, False)


def test_no_decay_1d_false_decays_every_trainable_parameter():
    model = TinyViT()
    (group,) = param_groups(model, OptimizerConfig(weight_decay=0.04, no_decay_1d=False))
    assert names_of(model, group["params"]) == DECAYED | NOT_DECAYED  # the frozen layer is in neither
    assert group["weight_decay"] == 0.04


def test_empty_group_is_left_out():
    groups = param_groups(nn.Linear(3, 2, bias=False), OptimizerConfig())
    assert len(groups) == 1 and groups[0]["decay"]


def test_dora_model_split():
    from raystream.data.config import StreamConfig
    from raystream.models import build_scenario
    from raystream.models.config import ScenarioConfig

    cfg = ScenarioConfig(name="dora")
    cfg.backbone.tubelet_size = 1
    cfg.backbone.embed_dim, cfg.backbone.depth, cfg.backbone.num_heads = 48, 1, 3
    cfg.dora.out_dim, cfg.dora.hidden_dim, cfg.dora.bottleneck_dim = 32, 32, 16
    model = build_scenario(cfg, StreamConfig(frames_per_clip=2, resolution=32)).model
    decayed, kept = param_groups(model, OptimizerConfig())
    kept_names = names_of(model, kept["params"])
    assert {"student.backbone.cls_token", "student.backbone.pos_embed", "student.backbone.norm.weight",
            "student.backbone.blocks.0.attn.qkv.bias"} <= kept_names
    assert all(model.get_parameter(n).ndim <= 1 for n in kept_names - {"student.backbone.cls_token",
                                                                        "student.backbone.pos_embed"})
    assert all(model.get_parameter(n).ndim >= 2 for n in names_of(model, decayed["params"]))
    assert "student.backbone.blocks.0.attn.qkv.weight" in names_of(model, decayed["params"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(decayed["params"]) + len(kept["params"]) == len(trainable)


@pytest.mark.parametrize("name", NAMES)
def test_only_the_decayed_group_is_decayed(name):
    """With zero gradients the first step is weight decay alone: p <- p (1 - lr wd) for the decayed group (AdamW's
    decoupled and SGD's L2 decay agree there), no change at all for the other."""
    model = TinyViT()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = OptimizerConfig(name=name, lr=0.1, weight_decay=0.5)
    opt = build_optimizer(param_groups(model, cfg), cfg)
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    opt.step()
    for n, p in model.named_parameters():
        want = before[n] * (1 - 0.1 * 0.5) if n in DECAYED else before[n]
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=0, msg=n)


def _train(groups_of, grads_seq, params):
    """Orthogonal-AdamW (global projection, no weight decay) over `groups_of(params)` optimizers."""
    opts = [build_optimizer(g, OptimizerConfig(name="orthogonal_adamw", lr=0.05, weight_decay=0.0)) for g in
            groups_of(params)]
    for grads in grads_seq:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        for opt in opts:
            opt.step()
    return [p.detach() for p in params]


def test_global_projection_spans_both_groups():
    """Split into the two groups, the run equals the one-group run; projecting each group on its own (one optimizer
    per group) would not."""
    shapes = [(6, 4), (4,), (5, 3), (5,)]
    seq = correlated_gradients(shapes, 6)

    def fresh():
        gen = torch.Generator().manual_seed(0)
        return [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes]

    class Model(nn.Module):
        def __init__(self, ps):
            super().__init__()
            for i, p in enumerate(ps):
                self.register_parameter(f"p{i}", p)

    cfg = OptimizerConfig(weight_decay=0.0)
    one = _train(lambda ps: [ps], seq, fresh())
    split = _train(lambda ps: [param_groups(Model(ps), cfg)], seq, fresh())
    apart = _train(lambda ps: [[g] for g in param_groups(Model(ps), cfg)], seq, fresh())
    for a, b in zip(split, one):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert max((a - b).abs().max().item() for a, b in zip(apart, one)) > 1e-4
