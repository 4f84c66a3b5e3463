"""`Orthogonal(base_optimizer)`: makes any torch.optim.Optimizer instance orthogonal (the paper's projection, then
the base optimizer's own update on u_t).

How it avoids the known pitfalls of optimizer wrappers:
- the closure is evaluated first, then the gradients it produced are projected, then the base steps without it
  (a base evaluating the closure after the projection would overwrite u_t with fresh raw gradients);
- it calls `Optimizer.__init__`, so step pre/post hooks registered on the wrapper (and global ones) fire;
- it shares the base's `param_groups` and `state`, and keeps the EMA in the base's per-parameter state
  (`state[p]["orth_ema"]`), so `state_dict()`/`load_state_dict()` of either object round-trip it;
- `p.grad` holds u_t only while the base steps and is the raw gradient again afterwards;
- a parameter's EMA enters the state after the base's first step on it (a base that initialises its state when
  `state[p]` is empty must find it empty).
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from raystream.optim.base import OrthogonalMixin, check_hparam, evaluate_closure, gradients_by_group
from raystream.optim.projection import advance_emas_, project_step


class Orthogonal(OrthogonalMixin, Optimizer):
    """Orthogonal(base_optimizer, orth_beta=0.9, projection="global", orth_init="zero").

    Param groups are the base's (each gets an `orth_beta`, default `orth_beta`); `add_param_group` goes through the
    base so its defaults apply. `foreach` selects the projection's multi-tensor path.
    """

    def __init__(self, base_optimizer: Optimizer, orth_beta: float = 0.9, projection: str = "global",
                 orth_init: str = "zero", *, orth_eps: float = 1e-8, foreach: bool = True,
                 diagnostics: bool = False):
        if not isinstance(base_optimizer, Optimizer):
            raise TypeError(f"Orthogonal wraps a torch.optim.Optimizer instance, got {type(base_optimizer).__name__}")
        if isinstance(base_optimizer, OrthogonalMixin):
            raise ValueError(f"{type(base_optimizer).__name__} already projects its gradients; do not wrap it again")
        self.base_optimizer = base_optimizer
        self._adopting = True  # Optimizer.__init__ re-adds the base's groups: take them as they are
        super().__init__(base_optimizer.param_groups, dict(orth_beta=orth_beta))
        self._adopting = False
        self.param_groups = base_optimizer.param_groups  # the same list and dicts: lr schedulers see one truth
        self.state = base_optimizer.state
        self._projection_foreach = foreach
        self._init_orthogonal(projection, orth_init, orth_eps=orth_eps, diagnostics=diagnostics)

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_adopting", True):
            super().add_param_group(param_group)
            return
        self.base_optimizer.add_param_group(param_group)
        group = self.base_optimizer.param_groups[-1]
        group.setdefault("orth_beta", self.defaults["orth_beta"])
        check_hparam("orth_beta", group["orth_beta"], 0 <= group["orth_beta"] < 1, "0 <= orth_beta < 1")

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)  # first: the projection must see the gradients the closure produces
        by_group = gradients_by_group(self)
        params = [p for _, ps, _ in by_group for p in ps]
        grads = [g for _, _, gs in by_group for g in gs]
        betas = [group["orth_beta"] for group, ps, _ in by_group for _ in ps]
        if not params:  # the base's step still runs (its hooks fire), on no gradient
            self.base_optimizer.step()
            return loss
        emas, fresh = self._emas(params)
        cos_prev = self._cos_prev(params, grads)
        u, sums = project_step(grads, emas, self.projection, self.orth_eps,
                               self._workspace if self._projection_foreach else None, self._cosine is not None)
        try:
            for p, g, ui in zip(params, grads, u):
                # some bases (foreach SGD + nesterov) write into p.grad: never hand them the raw gradient
                p.grad = ui.clone() if ui is g else ui
            self.base_optimizer.step()
        finally:
            for p, g in zip(params, grads):
                p.grad = g
        self._store_emas(params, emas, fresh)
        advance_emas_(emas, grads, betas, fresh, self.orth_init == "first_grad", self._projection_foreach)
        self._record_diagnostics(cos_prev, sums)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        self.base_optimizer.load_state_dict(state_dict)  # replaces the base's groups and state objects
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state
        for group in self.param_groups:
            group.setdefault("orth_beta", self.defaults["orth_beta"])
        self._restore_ema_precision(state_dict)

    def __repr__(self) -> str:
        return (f"Orthogonal({self.base_optimizer!r}, projection={self.projection!r}, "
                f"orth_init={self.orth_init!r})")
