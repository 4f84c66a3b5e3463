"""DoRA's DINO loss: cross-entropy from the teacher's centred, sharpened output to the student's, with the centre.

Inputs are head logits laid out (views, B, T, out_dim): the teacher's one unmasked view `teacher` (B, T, D), the
student's masked clips `masked` (K objects, B, T, D) and local crops `local` (L, B, T, D). With
P = softmax((teacher - centre) / teacher_temp) (no gradient) and H(P, s) = -sum P log softmax(s / student_temp):

    paper rule (default): loss = 1/2 mean_{k,t,b} H(P_bt, masked_kbt) + 1/2 mean_{l,t,b} H(P_bt, local_lbt)

i.e. per frame half a masked-clip term and half a local-crop term, averaged over frames and objects, every local
crop counted. `loss_rule: official` reproduces the official code (github.com/shashankvkt/DoRA_ICLR24 main.py)
with its two quirks, for comparison runs:
  1. the per-object accumulator `frame_loss` is never reset, so object j's term is (previous accumulator + its
     frame sum) / T: earlier objects are counted again, scaled by 1/T per later object;
  2. DINO's "skip the student view that the teacher also saw" rule (`if v == iq: continue`) is kept although the
     teacher has one view (the full clip) and the student's views are local crops, so local crop 0 is dropped
     from the loss (with one local crop the official local term is 0/0; here it is then 0).
We default to the paper's description because both quirks only re-weight terms (no extra signal) and quirk 2
wastes one crop's forward pass.

Two global views (`global_crops: 2`, the paper's Table 5; `forward_views`): the teacher sees both, `teacher`
(G=2, B, T, D), and the student the masked clips of each, `masked` (G, K, B, T, D), plus the local crops. As
DINO's `DINOLoss`, every student view is compared with every teacher view except its own:

    loss = 1/n sum_{g} [ sum_{v != g} mean_{k,t,b} H(P_g, masked_v) + sum_l mean_{t,b} H(P_g, local_l) ]

over the n = G * (G - 1 + L) terms (a global view's K masked clips are one student view, averaged over objects).
The centre follows the mean teacher logit over both views. Only the paper rule takes two views (the config says so).

The centre is an EMA (momentum 0.9) of the mean teacher logit over every clip and frame of the GLOBAL batch:
the per-process sum is all-reduced when a torch.distributed process group is initialised, else used as is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from raystream.checks import options_text
from raystream.models.config import DORA_LOSS_RULES


def cross_entropy(p: torch.Tensor, logits: torch.Tensor, student_temp: float) -> torch.Tensor:
    """Per-sample H(p, softmax(logits / temp)) over the last dim."""
    return torch.sum(-p * F.log_softmax(logits.float() / student_temp, dim=-1), dim=-1)


class DoraLoss(nn.Module):
    """forward(teacher, masked, local) -> scalar loss; updates the `center` buffer (1, out_dim) when training."""

    def __init__(self, out_dim: int, *, student_temp: float = 0.1, teacher_temp: float = 0.04,
                 center_momentum: float = 0.9, rule: str = "paper"):
        super().__init__()
        if rule not in DORA_LOSS_RULES:
            raise ValueError(f"scenario.dora.loss_rule = {rule!r}: expected one of {options_text(DORA_LOSS_RULES)}")
        self.student_temp, self.teacher_temp = float(student_temp), float(teacher_temp)
        self.center_momentum, self.rule = float(center_momentum), rule
        self.register_buffer("center", torch.zeros(1, out_dim))

    def teacher_probs(self, teacher: torch.Tensor) -> torch.Tensor:
        return F.softmax((teacher.float() - self.center) / self.teacher_temp, dim=-1).detach()

    @torch.no_grad()
    def teacher_entropy(self, teacher: torch.Tensor) -> torch.Tensor:
        """Mean entropy of the teacher's centred, sharpened distribution (log out_dim = uniform, 0 = one-hot)."""
        p = self.teacher_probs(teacher)
        return -(p * torch.log(p.clamp_min(1e-12))).sum(dim=-1).mean()

    def forward_views(self, teacher: torch.Tensor, masked: torch.Tensor, local: torch.Tensor,
                      update_center: bool = True) -> torch.Tensor:
        """Teacher logits of G global views (G, B, T, D), the student's masked clips of each (G, K, B, T, D) and
        local crops (L, B, T, D): `forward` for one view, DINO's cross-view loss (module docstring) for two."""
        if teacher.shape[0] == 1:
            return self.forward(teacher[0], masked[0], local, update_center)
        p = self.teacher_probs(teacher)  # (G, B, T, D)
        terms = []
        for g in range(p.shape[0]):
            terms += [cross_entropy(p[g], masked[v], self.student_temp).mean() for v in range(p.shape[0]) if v != g]
            terms += [cross_entropy(p[g], view, self.student_temp).mean() for view in local]
        if update_center:
            self.update_center(teacher)
        return sum(terms) / len(terms)

    def forward(self, teacher: torch.Tensor, masked: torch.Tensor, local: torch.Tensor,
                update_center: bool = True) -> torch.Tensor:
        """One global view: teacher (B, T, D), masked (K, B, T, D), local (L, B, T, D)."""
        p = self.teacher_probs(teacher)  # (B, T, D)
        mask_ce = cross_entropy(p.unsqueeze(0), masked, self.student_temp)  # (K, B, T)
        local_ce = cross_entropy(p.unsqueeze(0), local, self.student_temp)  # (L, B, T)
        if self.rule == "paper":
            terms = [mask_ce.mean()] + ([local_ce.mean()] if local_ce.numel() else [])  # no local crops: masked only
            loss = sum(terms) / len(terms)
        else:
            loss = official_rule(mask_ce, local_ce)
        if update_center:
            self.update_center(teacher)
        return loss

    @torch.no_grad()
    def update_center(self, teacher: torch.Tensor) -> None:
        """centre <- m * centre + (1 - m) * mean teacher logit over the global batch (all processes, all frames)."""
        flat = teacher.detach().float().reshape(-1, teacher.shape[-1])
        total = flat.sum(dim=0, keepdim=True)
        count = flat.new_full((1,), float(flat.shape[0]))
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(total)
            dist.all_reduce(count)
        batch_center = total / count
        self.center.mul_(self.center_momentum).add_(batch_center * (1.0 - self.center_momentum))


def official_rule(mask_ce: torch.Tensor, local_ce: torch.Tensor) -> torch.Tensor:
    """The official loop over objects j and frames t, quirks included (see the module docstring).

    mask_ce (K, B, T), local_ce (L, B, T): per-sample cross-entropies; each term is first averaged over B.
    """
    mask_t = mask_ce.mean(dim=1)  # (K, T)
    local_t = local_ce.mean(dim=1)  # (L, T)
    kept = local_t[1:]  # quirk 2: local crop 0 is skipped
    local_term = kept.mean(dim=0) if kept.shape[0] else torch.zeros_like(local_t[0])  # (T,)
    num_objects, num_frames = mask_t.shape
    frame_loss = mask_t.new_zeros(())
    total = mask_t.new_zeros(())
    for j in range(num_objects):  # quirk 1: frame_loss carries over from object j - 1
        frame_loss = frame_loss + (0.5 * (mask_t[j] + local_term)).sum()
        frame_loss = frame_loss / num_frames
        total = total + frame_loss
    return total / num_objects
