"""raystream.optim: the optimizers of "Learning from Streaming Video with Orthogonal Gradients" (Han et al., 2025).

    OrthogonalAdamW, OrthogonalSGD   the paper's Algorithms 2 and 1 (orthogonal.py, sgd.py; shaped as torch's adamw)
    orthogonal_adamw(params, ...)    Algorithm 2 over plain lists: single-tensor reference, multi-tensor, compiled
    OrthogonalAdamW(compile=True)    Algorithm 2 as one torch.compile'd step (compiled.py)
    Orthogonal(base_optimizer)       the projection in front of any torch.optim.Optimizer (wrapper.py)
    SlowerAdamW                      the supplementary baseline: AdamW slowed by 1 - cos(g_t, g_{t-1}) (slower.py)
    build_optimizer(params, cfg)     the optimizer a run config names (factory.py)
    param_groups(model, cfg)         decayed / not decayed (biases, norms, ViT tokens) param groups (groups.py)
    GradCosineTracker(params)        cos(g_t, g_{t-1}) for plain torch optimizers (diagnostics.py)
    project, update_ema              the projection and the EMA as pure functions of tensor lists (projection.py)

Pure torch: no Ray, no raystream.config.
"""

from raystream.optim.diagnostics import GradCosineTracker
from raystream.optim.factory import build_optimizer
from raystream.optim.groups import param_groups
from raystream.optim.orthogonal import OrthogonalAdamW, orthogonal_adamw
from raystream.optim.projection import project, update_ema
from raystream.optim.sgd import OrthogonalSGD
from raystream.optim.slower import SlowerAdamW
from raystream.optim.wrapper import Orthogonal

__all__ = ["OrthogonalAdamW", "orthogonal_adamw", "OrthogonalSGD", "SlowerAdamW", "Orthogonal", "build_optimizer",
           "GradCosineTracker", "param_groups", "project", "update_ema"]
