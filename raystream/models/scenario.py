"""The small interface every scenario (VideoMAE, future prediction, DoRA) shows the training loop, and the registry.

The loop never branches on the scenario:

    scenario = build_scenario(cfg.scenario, cfg.stream, seed=cfg.trainer.seed)
    scenario.set_total_steps(total)              # schedules inside a scenario (no-op for most)
    model = scenario.model                       # nn.Module; wrap in DDP, move to the device
    out = model({'frames': ..., 'target': ..., 'index': ..., 'step': t})
    out['loss'].backward(); opt.step(); scenario.after_step(t)
    # out['in_stream/<m>']: measured on this batch before the update; the loop averages them over the stream
    metrics = scenario.evaluate(model, cfg.eval, probe=probe_set if 'probe' in scenario.needs else None,
                                heldout=heldout_batches if 'heldout' in scenario.needs else None)

A scenario module registers its builder with `@register_scenario("name")`; `build_scenario` imports
`raystream.models.<name>` on first use. Adding a scenario: its module, and its name in `SCENARIOS`
(raystream/models/config.py), the options `scenario.name` accepts.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple

import numpy as np
import torch
from torch import nn

from raystream.checks import options_text
from raystream.eval.config import EvalConfig
from raystream.eval.pixels import heldout_pixel_metrics
from raystream.eval.probes import FeatureCache, probe_metrics
from raystream.eval.shard import Shard
from raystream.models.config import SCENARIOS, ScenarioConfig
from raystream.models.vit import VisionTransformer

Builder = Callable[[Any, Any, int], "Scenario"]
_REGISTRY: Dict[str, Builder] = {}


def register_scenario(name: str) -> Callable[[Builder], Builder]:
    """Decorator: `builder(scenario_cfg, stream_cfg, seed) -> Scenario` becomes `scenario.name=<name>` (the config
    accepts the names listed in `SCENARIOS`)."""

    def deco(builder: Builder) -> Builder:
        _REGISTRY[name] = builder
        return builder

    return deco


def build_scenario(scenario_cfg: ScenarioConfig, stream_cfg: Any, seed: int = 0) -> "Scenario":
    """The scenario named by `scenario_cfg.name` (one of `SCENARIOS`), its model initialised (seeded, or from
    `backbone.init`)."""
    name = str(scenario_cfg.name)
    if name not in _REGISTRY and name in SCENARIOS:
        importlib.import_module(f"raystream.models.{name}")  # registers it
    if name not in _REGISTRY:
        raise ValueError(f"scenario.name = {name!r}: expected one of {options_text(SCENARIOS)}")
    return _REGISTRY[name](scenario_cfg, stream_cfg, int(seed))


def check_init(scenario_cfg: ScenarioConfig, stream_cfg: Any, seed: int = 0) -> Optional[str]:
    """The line `scenario.backbone.init` would give, checked on a model built on the meta device (no weights are
    allocated or copied); raises CheckpointError for a file that does not fit. None for random weights."""
    with torch.device("meta"):
        return build_scenario(scenario_cfg, stream_cfg, seed).init_line


def weight_seed(scenario_cfg: ScenarioConfig, seed: int) -> int:
    """The seed the model's random weights are drawn from: a mix of `scenario.backbone.seed` and the run seed."""
    return int(np.random.SeedSequence([int(scenario_cfg.backbone.seed), int(seed)]).generate_state(1)[0])


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Context in which torch's global RNG is seeded, restored on exit (model construction)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def first_vit(model: nn.Module) -> Optional[nn.Module]:
    """The model's first VisionTransformer (its encoder), or None."""
    return next((m for m in model.modules() if isinstance(m, VisionTransformer)), None)


def encoder_heads(model: nn.Module) -> Optional[int]:
    """The attention heads of the model's encoder: V-JEPA's attentive probe uses the encoder's head count."""
    vit = first_vit(model)
    return int(vit.num_heads) if vit is not None else None


def as_model_clips(model: nn.Module, clips: torch.Tensor) -> torch.Tensor:
    """Images (B, 1, C, H, W) of an image probe set repeated over the frames a video encoder takes (its
    `num_frames`; as V-JEPA evaluates images); clips, and images for an image encoder, unchanged."""
    vit = first_vit(model)
    if clips.shape[1] == 1 and vit is not None and vit.video:
        return clips.expand(-1, int(vit.num_frames), -1, -1, -1)
    return clips


def model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


class Scenario:
    """What a scenario gives the loop: `model`, `needs`, `set_total_steps(n)`, `after_step(step)`, `evaluate(...)`.

    Subclasses set `name` and `needs`; they override `encode(model, clips) -> (features, tokens)` (what the probes
    read, e.g. DoRA's teacher) and `predict(model, frames)` when the model's own methods are not the right ones.
    """

    name: str = ""
    needs: frozenset = frozenset()

    def __init__(self, model: nn.Module, seed: int = 0, init_line: Optional[str] = None):
        self.model = model
        self.seed = seed
        self.init_line = init_line  # what `scenario.backbone.init` loaded, in one line (None: random weights)

    def set_total_steps(self, total_steps: int) -> None:
        """The loop announces the run's number of optimizer steps (for schedules such as DoRA's teacher momentum).
        Nothing to do by default."""

    def after_step(self, step: int) -> None:
        """Called by the loop after each optimizer step (e.g. DoRA's teacher EMA). Nothing to do by default."""

    def drift_modules(self, model: nn.Module) -> Dict[str, nn.Module]:
        """Modules the evaluations read besides the trained parameters, by name (`drift/<name>` says how far each
        moved from the start, raystream/train/drift.py); none by default."""
        return {}

    def encode(self, model: nn.Module, clips: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(features (B, D), tokens (B, L, D)) the probes read; by default the model's own `encode`."""
        if not hasattr(model, "encode"):
            raise NotImplementedError(f"scenario {self.name!r} has no probe features")
        return model.encode(clips)

    def predict(self, model: nn.Module, frames: torch.Tensor) -> torch.Tensor:
        """Predicted target frames for out-of-stream evaluation; by default the model's own `predict`."""
        if not hasattr(model, "predict"):
            raise NotImplementedError(f"scenario {self.name!r} does not predict frames")
        return model.predict(frames)

    def evaluate(self, model: nn.Module, eval_cfg: EvalConfig, probe: Any = None,
                 heldout: Optional[Iterable] = None, shard: Shard = Shard(),
                 cache: Optional[FeatureCache] = None) -> Dict[str, float]:
        """`eval/<metric>` floats: probe metrics when `probe` is given, out-of-stream pixel metrics when `heldout`
        is. The model is frozen (eval mode, no gradients) and put back in its previous mode afterwards. `shard`
        and `cache`: the probes' (raystream/eval/probes.py); every rank of the shard calls this at once."""
        net = unwrap(model)
        device = model_device(net)
        was_training = net.training
        net.eval()
        out: Dict[str, float] = {}
        try:
            if probe is not None:
                out.update(probe_metrics(lambda x: self.encode(net, as_model_clips(net, x)), probe, eval_cfg,
                                         device=device, num_heads=encoder_heads(net), shard=shard, cache=cache))
            if heldout is not None:
                out.update(heldout_pixel_metrics(lambda x: self.predict(net, x), heldout,
                                                 max_batches=int(eval_cfg.heldout_batches),
                                                 device=device))
        finally:
            net.train(was_training)
        return out
