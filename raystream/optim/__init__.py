"""raystream.optim: the optimizers of "Learning from Streaming Video with Orthogonal Gradients" (Han et al., 2025),
shaped like torch.optim: one file per optimizer (its class, `_init_group`, dispatch and implementations).

    orthogonal_adamw.py  OrthogonalAdamW, orthogonal_adamw: Algorithm 2, whole (single / multi-tensor / compiled)
    orthogonal_sgd.py    OrthogonalSGD: Algorithm 1
    slower_adamw.py      SlowerAdamW: the supplementary baseline, AdamW slowed by 1 - cos(g_t, g_{t-1})
    wrapper.py           Orthogonal(base_optimizer): the projection in front of any torch.optim.Optimizer
    projection.py        project, update_ema: u = g - k c and the EMA as pure functions of tensor lists
    base.py              the EMA in the state, the diagnostics beside it; GradCosineTracker for plain torch optimizers
    factory.py           build_optimizer, param_groups, OptimizerConfig: what a run config names

Pure torch: no Ray, no raystream.config.
"""

from raystream.optim.base import GradCosineTracker
from raystream.optim.factory import OptimizerConfig, build_optimizer, param_groups
from raystream.optim.orthogonal_adamw import OrthogonalAdamW, orthogonal_adamw
from raystream.optim.orthogonal_sgd import OrthogonalSGD
from raystream.optim.projection import project, update_ema
from raystream.optim.slower_adamw import SlowerAdamW
from raystream.optim.wrapper import Orthogonal

__all__ = ["OrthogonalAdamW", "orthogonal_adamw", "OrthogonalSGD", "SlowerAdamW", "Orthogonal", "build_optimizer",
           "GradCosineTracker", "param_groups", "project", "update_ema", "OptimizerConfig"]
