"""The `dora` scenario: builder (from `scenario.*`, `scenario.dora.*`, `stream.*`) and the loop-facing Scenario.

The train loop needs nothing DoRA-specific:
- `scenario.model` is a `DoRA` module; its parameters are the student's only (the teacher lives in buffers), so
  `[p for p in model.parameters() if p.requires_grad]` is exactly what the optimizer must see, and DDP all-reduces
  only student gradients;
- `after_step(step)` moves the teacher: EMA with momentum cosine(0.996 -> 1) over `scenario.dora.momentum_steps`
  steps, or over the run's total steps when the loop announces them with `set_total_steps(total)`; when neither is
  known the momentum stays at its base value (logged once);
- `needs = {'probe'}`: `evaluate` gives `eval/knn_top1`, `eval/linear_top1` (and `eval/attn_top1` when asked) on
  the TEACHER backbone's features (`DoRA.encode`).
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any, Optional, Tuple

import torch
from torch import nn

from raystream.models.checkpoint import initialise, load_state_dict_file
from raystream.models.config import DoraConfig
from raystream.models.dora.head import DINOHead
from raystream.models.dora.loss import RULES
from raystream.models.dora.model import DoRA
from raystream.models.dora.teacher import cosine_momentum, ddp_ignore_teacher, ema_update
from raystream.models.scenario import Scenario, register_scenario, seeded, unwrap, weight_seed
from raystream.models.vit import build_vit

log = logging.getLogger(__name__)


class DoraScenario(Scenario):
    name = "dora"
    needs = frozenset({"probe"})

    def __init__(self, model: DoRA, seed: int = 0, *, momentum_teacher: float = 0.996,
                 momentum_steps: Optional[int] = None):
        super().__init__(model, seed)
        self.momentum_teacher = float(momentum_teacher)
        self.total_steps: Optional[int] = int(momentum_steps) if momentum_steps else None
        self.momentum = self.momentum_teacher
        self._warned = False

    def set_total_steps(self, total_steps: int) -> None:
        """The run's number of optimizer steps: the length of the momentum schedule unless
        `scenario.dora.momentum_steps` fixed it."""
        if self.total_steps is None:
            self.total_steps = int(total_steps)

    def momentum_at(self, step: int) -> float:
        if self.total_steps is None:
            if not self._warned:
                log.warning("dora: the run's total steps are unknown (set scenario.dora.momentum_steps); the teacher "
                            "momentum stays at %s", self.momentum_teacher)
                self._warned = True
            return self.momentum_teacher
        return cosine_momentum(step, self.total_steps, self.momentum_teacher, 1.0)

    def after_step(self, step: int) -> None:
        """Teacher EMA after the optimizer step of global step `step`."""
        net = unwrap(self.model)
        self.momentum = self.momentum_at(step)
        ema_update(net.student, net.teacher, self.momentum)

    def encode(self, model: nn.Module, clips: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return model.encode(clips)


def dora_options(scenario_cfg: Any) -> SimpleNamespace:
    """`scenario.dora` as a plain namespace (defaults for missing keys), range-checked with the key in the error."""
    given = getattr(scenario_cfg, "dora", None)
    opts = SimpleNamespace(**{f.name: (getattr(given, f.name, None) if given is not None else None)
                              for f in dataclasses.fields(DoraConfig)})
    for f in dataclasses.fields(DoraConfig):
        if getattr(opts, f.name) is None and f.name not in ("local_size", "momentum_steps"):
            setattr(opts, f.name, f.default)
    checks = [
        ("num_objects", opts.num_objects >= 1, "an integer >= 1 (at most the backbone's heads)"),
        ("local_crops", opts.local_crops >= 0, "an integer >= 0"),
        ("local_size", opts.local_size is None or opts.local_size >= 1, "null or a size in pixels"),
        ("local_crop_min", 0 < opts.local_crop_min <= opts.local_crop_max <= 1,
         "0 < local_crop_min <= local_crop_max <= 1"),
        ("global_crop_min", 0 < opts.global_crop_min <= 1, "an area fraction in (0, 1]"),
        ("color_jitter", 0 <= opts.color_jitter <= 1, "a probability"),
        ("grayscale", 0 <= opts.grayscale <= 1, "a probability"),
        ("flip", 0 <= opts.flip <= 1, "a probability"),
        ("out_dim", opts.out_dim >= 2, "an integer >= 2"),
        ("hidden_dim", opts.hidden_dim >= 1, "an integer >= 1"),
        ("bottleneck_dim", opts.bottleneck_dim >= 1, "an integer >= 1"),
        ("head_layers", opts.head_layers >= 1, "an integer >= 1"),
        ("freeze_last_layer_steps", opts.freeze_last_layer_steps >= 0, "an integer >= 0"),
        ("student_temp", opts.student_temp > 0, "a temperature > 0"),
        ("teacher_temp", opts.teacher_temp > 0, "a temperature > 0"),
        ("center_momentum", 0 <= opts.center_momentum < 1, "an EMA factor in [0, 1)"),
        ("momentum_teacher", 0 <= opts.momentum_teacher <= 1, "an EMA factor in [0, 1]"),
        ("momentum_steps", opts.momentum_steps is None or opts.momentum_steps >= 1, "null or an integer >= 1"),
        ("sinkhorn_epsilon", opts.sinkhorn_epsilon > 0, "a value > 0"),
        ("sinkhorn_iters", opts.sinkhorn_iters >= 1, "an integer >= 1"),
        ("loss_rule", opts.loss_rule in RULES, f"one of {', '.join(RULES)}"),
    ]
    for key, ok, expected in checks:
        if not ok:
            raise ValueError(f"scenario.dora.{key} = {getattr(opts, key)!r}: expected {expected}")
    return opts


def _local_size(opts: SimpleNamespace, resolution: int, patch: int) -> int:
    size = int(opts.local_size) if opts.local_size is not None else max(patch, (resolution // 2) // patch * patch)
    if size % patch:
        raise ValueError(f"scenario.dora.local_size = {size} is not divisible by the patch size {patch}")
    return size


@register_scenario("dora")
def build_dora(scenario_cfg: Any, stream_cfg: Any, seed: int = 0) -> DoraScenario:
    """DoRA for clips of `stream.frames_per_clip` frames at `stream.resolution` px: an image ViT (scenario.backbone,
    tubelet_size 1) per frame, student and EMA teacher with DINO heads (scenario.dora)."""
    opts = dora_options(scenario_cfg)
    tubelet = int(getattr(scenario_cfg.backbone, "tubelet_size", 1))
    if tubelet != 1:
        raise ValueError(f"scenario.backbone.tubelet_size = {tubelet}: DoRA runs an image ViT on every frame; "
                         "expected 1 (scenario=dora sets it)")
    res = int(stream_cfg.resolution)
    with seeded(weight_seed(scenario_cfg, seed)):
        backbone = build_vit(scenario_cfg.backbone, img_size=res, num_frames=1)
        head = DINOHead(backbone.embed_dim, int(opts.out_dim), hidden_dim=int(opts.hidden_dim),
                        bottleneck_dim=int(opts.bottleneck_dim), layers=int(opts.head_layers),
                        norm_last_layer=bool(opts.norm_last_layer))
    if int(opts.num_objects) > backbone.num_heads:
        raise ValueError(f"scenario.dora.num_objects = {opts.num_objects}: expected at most the backbone's "
                         f"{backbone.num_heads} heads (one [CLS] attention map seeds each object)")
    model = DoRA(backbone, head, opts, local_size=_local_size(opts, res, backbone.patch_size), seed=seed)
    init = getattr(scenario_cfg.backbone, "init", "random")
    path = initialise(model, init, encoder=model.student.backbone)
    if path is not None and not any(k.startswith("teacher.") for k in load_state_dict_file(path)):
        model.teacher.load_state_dict(model.student.state_dict())  # a backbone init: the teacher starts equal
    ddp_ignore_teacher(model)
    return DoraScenario(model, seed, momentum_teacher=float(opts.momentum_teacher),
                        momentum_steps=opts.momentum_steps)
