"""The old import path of the step's window (`StepWindow`, `read_back_due`), now in raystream/train/step.py
(`raystream bench` imports it from here)."""

from raystream.train.step import READ_BACK, StepWindow, finite_check_values, read_back_due

__all__ = ["READ_BACK", "StepWindow", "finite_check_values", "read_back_due"]
