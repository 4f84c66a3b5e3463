"""The Hydra config tree, installed as the package `raystream._sweeps` (see pyproject.toml) so that a wheel ships it.

Only its YAML files matter; this file makes the directory a package that `importlib.resources` finds, installed or
editable (`raystream.config_tree`).
"""
