"""The DoRA model (Venkataramanan et al., ICLR 2024, "Is ImageNet worth 1 video?") as a raystream scenario model.

forward(batch) on clips (B, T, C, H, W), all without a Python loop over frames:
  views (augment.py) -> teacher on the global view of every frame: head logits, and from the last block the
  attention/queries/keys (tracking.py) -> K objects discovered on frame 0 and tracked through the clip ->
  K masked clips -> student on the masked clips and on the local crops -> DINO loss (loss.py), centre update.
With `global_crops: 2` every step runs on both global views at once (stacked on the batch axis): each is tracked
and masked on its own, and the loss compares views across (loss.py `forward_views`).
The loss is H(teacher) + KL(teacher || student); `teacher_entropy` (detached) is returned beside it, since the
centring raises it while the student's KL falls (what the student learns is loss - teacher_entropy).

Parameters the optimizer sees: the student backbone and head (`student.*`). The teacher (`teacher.*`) is an EMA
copy held in buffers (teacher.py); `DoraScenario.after_step` moves it. Probes read the teacher backbone's [CLS]
features, averaged over the clip's frames (`encode`).
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

import torch
from torch import nn

from raystream.models.config import DoraConfig
from raystream.models.dora.augment import choose_heads, make_views
from raystream.models.dora.head import DINOHead
from raystream.models.dora.loss import DoraLoss
from raystream.models.dora.teacher import frozen_copy
from raystream.models.dora.tracking import discover_objects, mask_clips, teacher_forward, track_masks
from raystream.models.pixels import as_float, normalize_input
from raystream.models.vit import VisionTransformer


class StudentTeacherNet(nn.Module):
    """A backbone and a DINO head (DINO's MultiCropWrapper, minus the multi-resolution bookkeeping)."""

    def __init__(self, backbone: VisionTransformer, head: DINOHead):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, images: torch.Tensor, freeze_last_layer: bool = False) -> torch.Tensor:
        return self.head(self.backbone.features(images), freeze_last_layer=freeze_last_layer)


class DoRA(nn.Module):
    """forward(batch_dict) -> {'loss', 'teacher_entropy'}; encode(clips) -> teacher (features, tokens)."""

    def __init__(self, backbone: VisionTransformer, head: DINOHead, cfg: DoraConfig, *, local_size: int,
                 seed: int = 0):
        super().__init__()
        self.student = StudentTeacherNet(backbone, head)
        self.teacher = frozen_copy(self.student)
        self.criterion = DoraLoss(head.out_dim, student_temp=float(cfg.student_temp),
                                  teacher_temp=float(cfg.teacher_temp), center_momentum=float(cfg.center_momentum),
                                  rule=str(cfg.loss_rule))
        self.cfg, self.local_size, self.seed = cfg, int(local_size), int(seed)
        self.num_objects = int(cfg.num_objects)
        self.freeze_last_layer_steps = int(cfg.freeze_last_layer_steps)

    def train(self, mode: bool = True) -> "DoRA":
        super().train(mode)
        self.teacher.eval()  # no dropout/BN in the ViT today; the teacher never trains in any case
        return self

    @torch.no_grad()
    def track(self, global_view: torch.Tensor, heads: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Teacher logits (B, T, out_dim) of the normalised global view (B, T, C, H, W) and the object masks
        (B, K, T, h, w) found on frame 0 and tracked through the clip."""
        b, t, c, h, w = global_view.shape
        vit = self.teacher.backbone
        out = teacher_forward(vit, global_view.reshape(b * t, c, h, w))
        logits = self.teacher.head(vit.pool(out.tokens)).reshape(b, t, -1)
        n, d = out.key.shape[1], out.key.shape[2]
        first = slice(0, b * t, t)  # frame 0 of every clip
        prototypes = discover_objects(out.cls_attn[first], out.query[first], out.tokens[first, 1:], heads,
                                      epsilon=float(self.cfg.sinkhorn_epsilon),
                                      iterations=int(self.cfg.sinkhorn_iters))
        grid = (h // vit.patch_size, w // vit.patch_size)
        masks = track_masks(prototypes, out.key.reshape(b, t, n, d), grid)
        return logits, masks

    def forward(self, batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        frames = as_float(batch["frames"])
        b, t, c, h, w = frames.shape
        step = int(batch.get("step", 0) or 0)
        index = batch.get("index")
        index = list(range(b)) if index is None else [int(i) for i in torch.as_tensor(index).tolist()]
        global_views, local = make_views(frames, index, seed=self.seed, step=step, cfg=self.cfg,
                                         local_size=self.local_size)
        global_views, local = normalize_input(global_views), normalize_input(local)
        g = global_views.shape[0]
        global_view = global_views.reshape(g * b, t, c, h, w)  # the views' clips side by side: one pass each
        heads = choose_heads(self.teacher.backbone.num_heads, self.num_objects, seed=self.seed, step=step)
        teacher_logits, masks = self.track(global_view, heads)
        masked = mask_clips(global_view, masks, self.teacher.backbone.patch_size)  # (K, G * B, T, C, H, W)
        freeze = step < self.freeze_last_layer_steps
        k = masked.shape[0]
        student_masked = self.student(masked.reshape(k * g * b * t, c, h, w), freeze).reshape(k, g, b, t, -1)
        n_local, r = local.shape[0], local.shape[-1]
        if n_local:
            student_local = self.student(local.reshape(n_local * b * t, c, r, r), freeze).reshape(n_local, b, t, -1)
        else:
            student_local = student_masked.new_zeros(0, b, t, student_masked.shape[-1])
        teacher_logits = teacher_logits.reshape(g, b, t, -1)
        entropy = self.criterion.teacher_entropy(teacher_logits)  # before the centre moves
        loss = self.criterion.forward_views(teacher_logits, student_masked.transpose(0, 1), student_local,
                                            update_center=self.training)
        return {"loss": loss, "teacher_entropy": entropy}

    @torch.no_grad()
    def encode(self, clips: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Teacher backbone features of clips (B, T, C, H, W): [CLS] averaged over frames (B, D), and every
        frame's tokens concatenated (B, T * (1 + N), D) for the attentive probe."""
        x = normalize_input(as_float(clips))
        b, t = x.shape[:2]
        tokens = self.teacher.backbone(x.reshape(b * t, *x.shape[2:]))
        features = self.teacher.backbone.pool(tokens).reshape(b, t, -1).mean(dim=1)
        return features, tokens.reshape(b, t * tokens.shape[1], tokens.shape[2])
