"""Published ViT checkpoints, in their authors' layouts, translated to the keys of raystream's ViT (timm/DINO names).

Layouts read (after `module.` / `_orig_mod.` prefixes are stripped by checkpoint.py):
- DINO / timm: bare ViT keys (`patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.N.attn.qkv`, ..., `norm`). DINO's
  training checkpoints nest them under `backbone.` beside a projection head `head.*`; timm's may keep a classifier
  `head.weight` / `head.bias`. Heads are dropped. Keys that would change the function raystream's ViT computes
  (timm's `fc_norm`, `norm_pre`, layer scale `ls1`/`ls2` or `gamma_1`/`gamma_2`, register tokens, q/k norms, an
  attention-pool head) are refused by name: loading around them would give other features than the author's model.
- transformers ViT / VideoMAE (`embeddings.*`, `encoder.layer.N.attention.attention.query`, ..., an optional `vit.`
  or `videomae.` prefix of a task model): renamed; separate q, k, v projections are concatenated into `qkv`.
- official VideoMAE: pretraining (`encoder.*` beside `decoder.*`, `encoder_to_decoder`, `mask_token`: the encoder is
  taken) and fine-tuning (bare keys with `q_bias` / `v_bias`, `fc_norm`, `head`: `fc_norm` becomes the final `norm`,
  applied to every token where the fine-tuned model normalised their mean; the line says so).

Then the tensors are fitted to the target encoder by rules that keep the author's function where it can be kept:
- biases: q/v biases <-> one qkv bias with a zero k bias. Exact: a k bias adds q.b_k to every score of a query, which
  softmax ignores;
- patch kernel, image -> video (inflation, the mean rule): each of the tubelet's T frames gets the 2-D kernel / T, so
  a clip of identical frames embeds exactly as the image did (I3D's inflation);
- patch kernel, video -> image (deflation, the sum rule): the 2-D kernel is the sum over the T frames, so an image
  embeds as the tubelet of T copies of it did;
- positions: a learned table at another grid is resized with DINO's `interpolate_pos_encoding` (vit.dino_interpolate);
  a VideoMAE checkpoint (fixed sinusoid, no [CLS]) into a learned-position backbone: the sinusoid of the first time
  slice becomes the 2-D table, the [CLS] position is zero and the [CLS] token keeps its initialisation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch
from torch import nn

from raystream.models.vit import PRESETS, dino_interpolate, sinusoid_table

Tensor = torch.Tensor

LAYOUTS = ("DINO/DoRA backbone or training checkpoint (teacher/student)", "timm ViT (.pth/.safetensors)",
           "transformers ViTModel / VideoMAEModel", "official VideoMAE pretraining or fine-tuning",
           "a raystream model or run directory")

# Keys of timm ViT variants whose function raystream's ViT does not compute (what each one is, for the message).
_FUNCTION_CHANGING = (
    (r"(^|\.)fc_norm\.", "fc_norm (a norm after average pooling instead of the final norm)"),
    (r"(^|\.)norm_pre\.", "norm_pre (a norm before the blocks, CLIP-style)"),
    (r"\.ls[12]\.|\.gamma_[12]$", "layer scale (ls1/ls2 or gamma_1/gamma_2)"),
    (r"(^|\.)reg_token$", "register tokens (reg_token)"),
    (r"\.(q_norm|k_norm)\.|\.attn\.norm\.|\.mlp\.norm\.", "q/k or inner norms"),
    (r"(^|\.)attn_pool\.", "an attention-pool head (attn_pool)"),
)

_HF_RENAMES = (
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"blocks.\1.mlp.fc1."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"blocks.\1.mlp.fc2."),
    (r"^encoder\.layer\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^encoder\.layer\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (r"^layernorm\.", "norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.attention\.(q_bias|v_bias)$", r"blocks.\1.attn.\2"),  # VideoMAE
)
_HF_QKV = re.compile(r"^encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$")


class LayoutError(ValueError):
    """A state dict in no layout this module reads, or with keys it refuses; the message names them."""


@dataclass
class Translation:
    """A state dict in raystream's ViT keys, the name of the layout it came from and what was done to it."""

    state: Dict[str, Tensor]
    layout: str
    notes: List[str] = field(default_factory=list)


def _short(keys: List[str], n: int = 4) -> str:
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def _drop(state: Dict[str, Tensor], pattern: str, what: str, notes: List[str]) -> Dict[str, Tensor]:
    gone = sorted(k for k in state if re.search(pattern, k))
    if gone:
        notes.append(f"dropped {what} ({_short(gone, 3)})")
    return {k: v for k, v in state.items() if k not in gone}


def _from_transformers(state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    out: Dict[str, Tensor] = {}
    qkv: Dict[Tuple[str, str], Dict[str, Tensor]] = {}
    for key, value in state.items():
        m = _HF_QKV.match(key)
        if m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = value
            continue
        for pattern, repl in _HF_RENAMES:
            if re.match(pattern, key):
                key = re.sub(pattern, repl, key)
                break
        out[key] = value
    for (block, kind), parts in qkv.items():
        if kind == "weight":
            out[f"blocks.{block}.attn.qkv.weight"] = torch.cat([parts["query"], parts["key"], parts["value"]])
        elif "key" in parts:
            out[f"blocks.{block}.attn.qkv.bias"] = torch.cat([parts["query"], parts["key"], parts["value"]])
        else:  # VideoMAE: q and v biases only
            out[f"blocks.{block}.attn.q_bias"], out[f"blocks.{block}.attn.v_bias"] = parts["query"], parts["value"]
    return out


def to_vit_keys(state: Dict[str, Tensor]) -> Translation:
    """Recognise the layout of `state` and rename it to raystream's ViT keys; heads and decoders dropped."""
    notes: List[str] = []
    keys = set(state)
    hint = "DINO/timm ViT"
    for prefix in ("backbone.", "vit.", "videomae."):  # DINO's MultiCropWrapper; transformers' task models
        if any(k.startswith(prefix + "patch_embed.") or k.startswith(prefix + "embeddings.") for k in keys):
            state = _drop(state, r"^head\.", "the DINO projection head", notes) if prefix == "backbone." else state
            state = _drop(state, r"^(classifier|fc_norm|decoder|encoder_to_decoder)\.|^mask_token$",
                          "the classifier/decoder", notes) if prefix != "backbone." else state
            state = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
            keys = set(state)
            hint = "DINO/DoRA training checkpoint" if prefix == "backbone." else hint
    if "embeddings.patch_embeddings.projection.weight" in keys:
        layout = "transformers VideoMAEModel" if state[
            "embeddings.patch_embeddings.projection.weight"].dim() == 5 else "transformers ViTModel"
        state = _drop(state, r"^pooler\.", "the pooler", notes)
        return Translation(_from_transformers(state), layout, notes)
    if "encoder.patch_embed.proj.weight" in keys:  # VideoMAE pretraining (or a raystream scenario's encoder)
        layout = ("official VideoMAE pretraining checkpoint" if "encoder_to_decoder.weight" in keys
                  else "the encoder of a scenario checkpoint")
        state = _drop(state, r"^(decoder\.|encoder_to_decoder\.|mask_token$|pos_embed$)", "the decoder", notes)
        state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        return Translation(state, layout, notes)
    if "patch_embed.proj.weight" not in keys:
        raise LayoutError(f"no patch embedding found (keys {_short(sorted(keys))}); the layouts read are: "
                          + "; ".join(LAYOUTS))
    if any(k.endswith(".attn.q_bias") for k in keys):
        layout = "official VideoMAE fine-tuning checkpoint"
        if "fc_norm.weight" in keys:
            state = {("norm." + k[len("fc_norm."):] if k.startswith("fc_norm.") else k): v for k, v in state.items()}
            notes.append("fc_norm became the final norm (applied to every token; the fine-tuned model normalised "
                         "their mean)")
        state = _drop(state, r"^head\.", "the classifier", notes)
        return Translation(state, layout, notes)
    refused = [f"{what}: {_short(sorted(k for k in keys if re.search(p, k)), 2)}"
               for p, what in _FUNCTION_CHANGING if any(re.search(p, k) for k in keys)]
    if refused:
        raise LayoutError("keys that change the function of the ViT, which raystream's ViT does not compute: "
                          + "; ".join(refused) + " (a plain ViT with a [CLS] token and a final norm is expected)")
    head = sorted(k for k in keys if k.startswith("head."))
    if head and any(k.startswith(("head.mlp.", "head.last_layer.")) for k in head):
        state = _drop(state, r"^head\.", "the DINO projection head", notes)
        return Translation(state, "DINO/DoRA checkpoint", notes)
    if head:
        classes = state["head.weight"].shape[0] if "head.weight" in state else "?"
        state = _drop(state, r"^head\.", f"the classifier head, {classes} classes", notes)
    return Translation(state, hint, notes)


def _fit_biases(state: Dict[str, Tensor], own: Dict[str, Tensor], notes: List[str]) -> None:
    to_qv = [k for k in own if k.endswith(".attn.q_bias") and k not in state]
    for key in to_qv:
        fused = state.pop(key.replace(".q_bias", ".qkv.bias"), None)
        if fused is not None:
            q, _, v = fused.chunk(3)
            state[key], state[key.replace(".q_bias", ".v_bias")] = q, v
    to_qkv = [k for k in own if k.endswith(".attn.qkv.bias") and k not in state]
    for key in to_qkv:
        q = state.pop(key.replace(".qkv.bias", ".q_bias"), None)
        v = state.pop(key.replace(".qkv.bias", ".v_bias"), None)
        if q is not None and v is not None:
            state[key] = torch.cat([q, torch.zeros_like(q), v])
    if to_qv or to_qkv:
        notes.append("q/v biases " + ("split from the qkv bias (k bias dropped: softmax ignores it)" if to_qv
                                       else "joined into one qkv bias with a zero k bias (exact)"))


def _fit_patch_kernel(state: Dict[str, Tensor], own: Dict[str, Tensor], notes: List[str]) -> None:
    key = "patch_embed.proj.weight"
    if key not in state or key not in own or state[key].dim() == own[key].dim():
        return
    w, target = state[key], own[key]
    if w.dim() == 4 and target.dim() == 5:
        t = target.shape[2]
        state[key] = w.unsqueeze(2).repeat(1, 1, t, 1, 1) / t
        notes.append(f"inflated the 2-D patch kernel to {t}-frame tubelets (each frame gets kernel / {t}: identical "
                     "frames embed as the image)")
    elif w.dim() == 5 and target.dim() == 4:
        state[key] = w.sum(dim=2)
        notes.append(f"deflated the {w.shape[2]}-frame tubelet kernel to 2-D (sum over its frames: an image embeds "
                     "as the clip of its copies)")


def _fit_positions(state: Dict[str, Tensor], own: Dict[str, Tensor], notes: List[str]) -> None:
    if "pos_embed" not in own:
        if "pos_embed" in state or "cls_token" in state:
            raise LayoutError("the checkpoint has learned positions and a [CLS] token but this video backbone uses "
                              "fixed sinusoid positions: set scenario.backbone.pos_embed=learned")
        return
    target = own["pos_embed"]
    if "pos_embed" not in state:  # VideoMAE's sinusoid into a learned table
        n, dim = target.shape[1] - 1, target.shape[2]
        state["pos_embed"] = torch.cat([torch.zeros(1, 1, dim), sinusoid_table(n, dim)], dim=1)
        state.setdefault("cls_token", own["cls_token"].clone())
        notes.append("positions: the first time slice's sinusoid became the 2-D table ([CLS] position 0, [CLS] token "
                     "kept at its initialisation)")
        return
    have, want = state["pos_embed"].shape[1] - 1, target.shape[1] - 1
    if have != want:
        side = int(round(want ** 0.5))
        if side * side != want or int(round(have ** 0.5)) ** 2 != have:
            raise LayoutError(f"pos_embed has {have} patch positions, the model {want}: only square grids resize")
        state["pos_embed"] = dino_interpolate(state["pos_embed"].float(), side, side).to(state["pos_embed"].dtype)
        old = int(round(have ** 0.5))
        notes.append(f"positions resized {old}x{old} -> {side}x{side} (DINO's interpolate_pos_encoding)")


def fit_to(translation: Translation, encoder: nn.Module) -> Translation:
    """`translation` with biases, patch kernel and positions fitted to `encoder` (rules in the module docstring).
    Keys and shapes that still differ are left for the caller to report."""
    own = encoder.state_dict()
    state = dict(translation.state)
    notes = list(translation.notes)
    _fit_biases(state, own, notes)
    _fit_patch_kernel(state, own, notes)
    _fit_positions(state, own, notes)
    return Translation(state, translation.layout, notes)


def fitting_shape(state: Dict[str, Tensor]) -> str:
    """The `scenario.backbone` settings a ViT state dict (raystream keys) was made for, e.g. `preset=small`."""
    kernel = state.get("patch_embed.proj.weight")
    if kernel is None:
        return "an unknown backbone (no patch_embed.proj.weight)"
    patch, dim = int(kernel.shape[-1]), int(kernel.shape[0])
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    for name, shape in PRESETS.items():
        if (shape.patch_size, shape.embed_dim, shape.depth) == (patch, dim, depth):
            return f"scenario.backbone.preset={name}"
    return (f"scenario.backbone.patch_size={patch} scenario.backbone.embed_dim={dim} scenario.backbone.depth={depth} "
            "(and num_heads)")
