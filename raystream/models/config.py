"""Structured config of the `scenario` group (`sweeps/scenario/*.yaml`). Plain data: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class BackboneConfig:
    """A ViT backbone: a preset (tiny | small | base | large) and optional overrides of its shape."""

    preset: str = "tiny"
    patch_size: Optional[int] = None
    embed_dim: Optional[int] = None
    depth: Optional[int] = None
    num_heads: Optional[int] = None
    tubelet_size: int = 2
    init: str = "random"  # random | a .pt/.safetensors state dict | run:<raystream run dir or checkpoint>
    seed: int = 0


@dataclass
class MaskConfig:
    """VideoMAE tube masking."""

    ratio: float = 0.9
    mode: str = "per_sample"  # per_sample | per_batch | fixed


@dataclass
class ScenarioConfig:
    """Which of the paper's scenarios a run trains: videomae | future_prediction | dora."""

    name: str = "videomae"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    decoder_depth: int = 1
    decoder_dim: Optional[int] = None
    norm_pix_loss: bool = True
