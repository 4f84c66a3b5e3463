"""How far a run's weights moved from where it started: `drift/<group>` = ||θ_t - θ_0|| / ||θ_0||.

Groups: `params`, the parameters the optimizer trains, and one per module the scenario evaluates besides them
(`Scenario.drift_modules`: DoRA's teacher backbone, an EMA held in buffers, is what its probes read). A module's
group is every floating-point tensor of its `state_dict` (parameters and buffers alike).

θ_0 is copied to host memory once, when the worker is built: after `scenario.backbone.init` and before any
checkpoint is restored, so it is the run's start. A resumed run rebuilds the same start from the same config (the
same seed on the CPU, or the same `backbone.init` file) rather than storing a second copy of the model beside every
checkpoint; the checkpoint carries θ_0's fingerprint (`fingerprint()`: each group's squared norm and plain sum),
and a restore whose rebuilt start does not match it is said (`matches`), not measured from silently.

`measure()` runs at evaluations and at the end only: each tensor's difference is taken on its own device and the
squares summed there, then ONE host read per call; nothing happens in the step loop. Pure torch.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping

import torch
from torch import nn

PARAMS = "params"
Tensors = Callable[[], List[torch.Tensor]]  # the group's current tensors (looked up at each call: `.to()` moves buffers)


def module_tensors(module: nn.Module) -> Tensors:
    """The floating-point tensors of `module`'s state dict (parameters and buffers), looked up at each call."""
    return lambda: [t for t in module.state_dict(keep_vars=True).values() if t.is_floating_point()]


class Drift:
    """θ_0 of each group on the host; `measure()` gives {group: ||θ - θ_0|| / ||θ_0||} of the current tensors."""

    def __init__(self, groups: Mapping[str, Tensors]):
        self.groups = dict(groups)
        self.start = {name: [t.detach().to("cpu", copy=True) for t in get()] for name, get in self.groups.items()}
        self._fingerprint = {name: _sums(tensors) for name, tensors in self.start.items()}

    @classmethod
    def of(cls, params: List[torch.Tensor], modules: Mapping[str, nn.Module]) -> "Drift":
        """The trained `params` (group `params`) and each named module (group `<name>`)."""
        groups: Dict[str, Tensors] = {PARAMS: lambda: list(params)}
        groups.update({name: module_tensors(module) for name, module in modules.items()})
        return cls(groups)

    def measure(self) -> Dict[str, float]:
        """{group: ||θ_t - θ_0|| / ||θ_0||} (0 when θ_0 is zero and nothing moved); one host read."""
        squares = []
        for name, get in self.groups.items():
            now = get()
            if len(now) != len(self.start[name]):
                raise RuntimeError(f"drift/{name}: {len(now)} tensors now, {len(self.start[name])} at the start")
            total = None
            for t, t0 in zip(now, self.start[name]):
                d = (t.detach().double() - t0.to(t.device, non_blocking=True).double()).square().sum()
                total = d if total is None else total + d
            squares.append(total if total is not None else torch.zeros((), dtype=torch.float64))
        device = squares[0].device if squares else torch.device("cpu")
        moved = torch.stack([s.to(device) for s in squares]).sqrt().tolist()  # the one host read
        out = {}
        for name, dist in zip(self.groups, moved):
            norm = self._fingerprint[name][0] ** 0.5
            out[name] = dist / norm if norm > 0 else (0.0 if dist == 0 else float("inf"))
        return out

    def fingerprint(self) -> Dict[str, List[float]]:
        """{group: [squared norm, sum] of θ_0} in float64: what a checkpoint keeps to recognise its run's start."""
        return {name: list(v) for name, v in self._fingerprint.items()}

    def matches(self, stored: Mapping[str, List[float]], rel: float = 1e-9) -> List[str]:
        """The groups whose θ_0 differs from a checkpoint's `stored` fingerprint (empty: the same start)."""
        out = []
        for name, (sq, total) in self._fingerprint.items():
            if name not in stored:
                continue
            sq0, total0 = (float(v) for v in stored[name])
            if abs(sq - sq0) > rel * max(abs(sq0), 1e-30) or abs(total - total0) > rel * max(sq0 ** 0.5, 1e-30):
                out.append(name)
        return out


def _sums(tensors: List[torch.Tensor]) -> tuple:
    """(sum of squares, sum) of the tensors' values in float64."""
    sq = sum((t.double().square().sum().item() for t in tensors), 0.0)
    total = sum((t.double().sum().item() for t in tensors), 0.0)
    return sq, total
