"""The old import path of the training schedules, now in `raystream.schedule` (`raystream bench` imports them
from here)."""

from raystream.schedule import CosineWeightDecay, Schedules, WarmupCosine, build_weight_decay_schedule, set_weight_decay

__all__ = ["CosineWeightDecay", "Schedules", "WarmupCosine", "build_weight_decay_schedule", "set_weight_decay"]
