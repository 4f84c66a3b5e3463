"""Checkpoints written by the reference libraries themselves (random weights, nothing downloaded), one function per
published format: each builds the reference model at a preset's size, saves it in that library's own format into
`directory` and returns (path to give `scenario.backbone.init`, the reference model in eval mode).

Sizes: `PRESET_SHAPES` (patch, width, depth, heads) as raystream's presets; `depth` shortens a model where the
property tested does not depend on it. Positions are drawn with std `pos_std` (0.5: the scale of a trained model's,
so a wrong interpolation shows; the libraries' own init, std 0.02, would hide it).

timm needs an importable torchvision; `timm_available()` says whether this machine has one (a CPU torch has no
matching torchvision on PyPI: PyPI's torchvision is built against the CUDA torch). timm's files and outputs come
from a fixture timm wrote instead (fixtures/make_timm_fixtures.py), so those checks run without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Tuple

import torch

PRESET_SHAPES = {"tiny": (8, 96, 3, 3), "small": (16, 384, 12, 6), "base": (16, 768, 12, 12),
                 "large": (16, 1024, 24, 16)}


def timm_available() -> Optional[str]:
    """None when timm imports here, else why not (the first line of the error)."""
    try:
        import timm  # noqa: F401
    except Exception as exc:  # ModuleNotFoundError, or torchvision's RuntimeError against a CPU torch
        return f"timm does not import: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def _randomise_positions(tensor: torch.Tensor, pos_std: float, seed: int) -> None:
    with torch.no_grad():
        tensor.copy_(torch.randn(tensor.shape, generator=torch.Generator().manual_seed(seed)) * pos_std)


def transformers_vit(directory: Path, preset: str = "small", *, image_size: int = 224, depth: Optional[int] = None,
                     pos_std: float = 0.5, seed: int = 0, pooler: bool = False) -> Tuple[Path, torch.nn.Module]:
    """transformers' ViTModel (google/vit-*-patch16-224[-in21k] layout; `pooler=True` as the ImageNet-21K files),
    saved with save_pretrained: a directory holding model.safetensors and config.json."""
    from transformers import ViTConfig, ViTModel

    patch, dim, full_depth, heads = PRESET_SHAPES[preset]
    torch.manual_seed(seed)
    config = ViTConfig(hidden_size=dim, num_hidden_layers=depth or full_depth, num_attention_heads=heads,
                       intermediate_size=4 * dim, image_size=image_size, patch_size=patch, layer_norm_eps=1e-6,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = ViTModel(config, add_pooling_layer=pooler).eval()
    _randomise_positions(model.embeddings.position_embeddings, pos_std, seed)
    model.save_pretrained(str(directory))
    return Path(directory) / "model.safetensors", model


def transformers_videomae(directory: Path, preset: str = "small", *, image_size: int = 224, num_frames: int = 16,
                          depth: Optional[int] = None, seed: int = 0) -> Tuple[Path, torch.nn.Module]:
    """transformers' VideoMAEModel (the official VideoMAE encoder: q/v biases, fixed sinusoid, final norm as in
    pretraining: use_mean_pooling=False), saved with save_pretrained (model.safetensors)."""
    from transformers import VideoMAEConfig, VideoMAEModel

    patch, dim, full_depth, heads = PRESET_SHAPES[preset]
    torch.manual_seed(seed)
    config = VideoMAEConfig(hidden_size=dim, num_hidden_layers=depth or full_depth, num_attention_heads=heads,
                            intermediate_size=4 * dim, image_size=image_size, patch_size=patch,
                            num_frames=num_frames, tubelet_size=2, layer_norm_eps=1e-6, use_mean_pooling=False,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = VideoMAEModel(config).eval()
    with torch.no_grad():  # transformers initialises the q/v biases to zero: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(str(directory))
    return Path(directory) / "model.safetensors", model


def official_videomae_pretraining(directory: Path, model: torch.nn.Module, decoder_dim: int = 192) -> Path:
    """The official VideoMAE pretraining file (MCG-NJU/VideoMAE, modeling_pretrain.py; `{'model': ..., 'args': ...}`)
    holding the encoder of transformers' `model`, in the official key names (the inverse of transformers'
    convert_videomae_to_pytorch.py), beside a decoder, encoder_to_decoder and mask_token."""
    out = {}
    for key, value in model.state_dict().items():
        k = (key.replace("embeddings.patch_embeddings.projection", "patch_embed.proj")
             .replace("encoder.layer.", "blocks.").replace("attention.output.dense", "attn.proj")
             .replace("intermediate.dense", "mlp.fc1").replace("output.dense", "mlp.fc2")
             .replace("layernorm_before", "norm1").replace("layernorm_after", "norm2"))
        k = "norm." + k[len("layernorm."):] if k.startswith("layernorm.") else k
        out["encoder." + k] = value
    for i in {k.split(".")[2] for k in out if k.startswith("encoder.blocks.")}:
        att = f"encoder.blocks.{i}.attention.attention."
        out[f"encoder.blocks.{i}.attn.qkv.weight"] = torch.cat([out.pop(att + n + ".weight")
                                                                for n in ("query", "key", "value")])
        out[f"encoder.blocks.{i}.attn.q_bias"] = out.pop(att + "query.bias")
        out[f"encoder.blocks.{i}.attn.v_bias"] = out.pop(att + "value.bias")
    dim = model.config.hidden_size
    out.update({"encoder_to_decoder.weight": torch.randn(decoder_dim, dim), "mask_token": torch.zeros(1, 1, decoder_dim),
                "decoder.norm.weight": torch.ones(decoder_dim), "decoder.head.weight": torch.randn(1536, decoder_dim)})
    path = Path(directory) / "checkpoint-799.pth"
    torch.save({"model": out, "epoch": 799, "args": argparse.Namespace(model="pretrain_videomae")}, path)
    return path


def dino_backbone(directory: Path, backbone_state: dict) -> Path:
    """DINO's backbone file (`dino_deitsmall16_pretrain.pth`): the bare ViT keys of a backbone state dict."""
    path = Path(directory) / "dino_deitsmall16_pretrain.pth"
    torch.save({k: v for k, v in backbone_state.items() if not k.startswith("head.")}, path)
    return path


def dino_training_checkpoint(directory: Path, student_state: dict, teacher_state: dict, head_dim: int = 64) -> Path:
    """DINO's / DoRA's `checkpoint.pth` (main_dino.py save_dict): `student` (DDP: `module.backbone.*`,
    `module.head.*`), `teacher` (`backbone.*`, `head.*`), optimizer, epoch, args (a Namespace), dino_loss."""
    def wrap(state: dict, prefix: str) -> dict:
        dim = next(v for k, v in state.items() if k == "cls_token").shape[-1]
        out = {f"{prefix}backbone.{k}": v for k, v in state.items() if not k.startswith("head.")}
        out.update({f"{prefix}head.mlp.0.weight": torch.randn(head_dim, dim), f"{prefix}head.mlp.0.bias":
                    torch.zeros(head_dim), f"{prefix}head.last_layer.weight_g": torch.ones(8, 1),
                    f"{prefix}head.last_layer.weight_v": torch.randn(8, head_dim)})
        return out

    path = Path(directory) / "checkpoint.pth"
    torch.save({"student": wrap(student_state, "module."), "teacher": wrap(teacher_state, ""), "optimizer": {},
                "epoch": 100, "args": argparse.Namespace(arch="vit_small", patch_size=16),
                "dino_loss": {"center": torch.zeros(1, head_dim)}}, path)
    return path
