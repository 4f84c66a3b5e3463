"""raystream.optim: the optimizers of "Learning from Streaming Video with Orthogonal Gradients" (Han et al., 2025),
shaped like torch.optim: one file per optimizer (its class, `_init_group`, dispatch and reference step), its fast
steps beside it as functional forms.

    orthogonal_adamw.py   OrthogonalAdamW, orthogonal_adamw: Algorithm 2, its dispatch and single-tensor reference
    multi_tensor_step.py  Orthogonal-AdamW's multi-tensor and compiled steps (all tensors at once)
    triton_step.py        Orthogonal-AdamW's fused step as two Triton kernels: where it runs, its tables, the launches
    triton_kernels.py     the Triton kernels of the fused step (Triton imported at the first fused step only)
    adamw.py              AdamW on a given gradient (single, foreach, fused), its state and a group's hyper-parameters
    orthogonal_sgd.py     OrthogonalSGD: Algorithm 1
    slower_adamw.py       SlowerAdamW: the supplementary baseline, AdamW slowed by 1 - cos(g_t, g_{t-1})
    wrapper.py            Orthogonal(base_optimizer): the projection in front of any torch.optim.Optimizer
    projection.py         project, update_ema: u = g - k c and the EMA as pure functions of tensor lists
    base.py               the EMA in the state, the diagnostics beside it; GradCosineTracker for plain torch optimizers
    factory.py            build_optimizer, param_groups, OptimizerConfig: what a run config names

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
