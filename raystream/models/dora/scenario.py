"""The `dora` scenario: builder (from `scenario.*`, `scenario.dora.*`, `stream.*`) and the loop-facing Scenario.

The train loop needs nothing DoRA-specific:
- `scenario.model` is a `DoRA` module; its parameters are the student's only (the teacher lives in buffers), so
  `[p for p in model.parameters() if p.requires_grad]` is exactly what the optimizer must see, and DDP all-reduces
  only student gradients;
- `after_step(step)` moves the teacher: EMA with momentum cosine(0.996 -> 1) over `scenario.dora.momentum_steps`
  steps, or over the run's total steps when the loop announces them with `set_total_steps(total)`; when neither is
  known the momentum stays at its base value (logged once);
- `needs = {'probe'}`: `evaluate` gives the probe metrics of `eval.protocol` (default: `eval/knn_top1`,
  `eval/linear_top1`; dino: kNN at k 10/20/100/200 and DINO's linear probe) on the TEACHER backbone's [CLS]
  (`DoRA.encode`), so `drift_modules` names the teacher backbone (`drift/teacher_backbone`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from raystream.models.checkpoint import initialise
from raystream.models.config import DoraConfig, ScenarioConfig
from raystream.models.dora.head import DINOHead
from raystream.models.dora.model import DoRA
from raystream.models.dora.teacher import cosine_momentum, ddp_ignore_teacher, ema_update
from raystream.models.scenario import Scenario, register_scenario, seeded, unwrap, weight_seed
from raystream.models.vit import build_vit

log = logging.getLogger(__name__)


class DoraScenario(Scenario):
    name = "dora"
    needs = frozenset({"probe"})

    def __init__(self, model: DoRA, seed: int = 0, *, momentum_teacher: float = 0.996,
                 momentum_steps: Optional[int] = None, init_line: Optional[str] = None):
        super().__init__(model, seed, init_line=init_line)
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

    def drift_modules(self, model: nn.Module) -> Dict[str, nn.Module]:
        """The teacher backbone: an EMA in buffers that the optimizer never sees, and what the probes read."""
        return {"teacher_backbone": unwrap(model).teacher.backbone}


def _local_size(opts: DoraConfig, resolution: int, patch: int) -> int:
    size = int(opts.local_size) if opts.local_size is not None else max(patch, (resolution // 2) // patch * patch)
    if size % patch:
        raise ValueError(f"scenario.dora.local_size = {size} is not divisible by the patch size {patch}")
    return size


@register_scenario("dora")
def build_dora(scenario_cfg: ScenarioConfig, stream_cfg: Any, seed: int = 0) -> DoraScenario:
    """DoRA for clips of `stream.frames_per_clip` frames at `stream.resolution` px: an image ViT (scenario.backbone,
    tubelet_size 1) per frame, student and EMA teacher with DINO heads (scenario.dora, range-checked by the config:
    raystream/models/config.py CHECKS)."""
    opts = scenario_cfg.dora
    tubelet = int(scenario_cfg.backbone.tubelet_size)
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
    loaded = initialise(model, scenario_cfg.backbone.init, encoder=model.student.backbone,
                        init_from=str(scenario_cfg.backbone.init_from))
    if loaded is not None and not any(k.startswith("teacher.") for k in loaded.keys):
        model.teacher.load_state_dict(model.student.state_dict())  # a backbone init: the teacher starts equal
    ddp_ignore_teacher(model)
    return DoraScenario(model, seed, momentum_teacher=float(opts.momentum_teacher),
                        momentum_steps=opts.momentum_steps, init_line=loaded.line if loaded else None)
