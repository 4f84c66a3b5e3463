"""Where raystream keeps what it fetches or makes on a node: `$RAYSTREAM_CACHE_DIR`, else `~/.cache/raystream`.

The one place that rule is written. Under it: `videos/` (the node cache of object-store videos, data/videos/cache.py),
`demo/` (the rendered demo videos, `data.demo.cache_dir`'s default), `models/` (`models:/` starts fetched from MLflow,
train/model_uri.py), `footage/` (registry footage, data/footage.py), `starts/` and `probes/` (made by presets).
Config files say it as `${raystream_cache_root:}/<sub>` (the resolver registered here, wherever the config schema
is imported), so the rule is not spelled again in sweeps/. Imports only OmegaConf: the probe child process and the
config schema read it.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

CACHE_ENV = "RAYSTREAM_CACHE_DIR"
CACHE_HOME = "~/.cache/raystream"


def cache_root() -> Path:
    """`$RAYSTREAM_CACHE_DIR`, else `~/.cache/raystream`, on the node that asks."""
    return Path(os.environ.get(CACHE_ENV) or os.path.expanduser(CACHE_HOME))


def configured_root() -> str:
    """The root as a config value: `$RAYSTREAM_CACHE_DIR` as set, else `~/.cache/raystream` as written (a path's
    user expands it), the text `${oc.env:RAYSTREAM_CACHE_DIR,'~/.cache/raystream'}` gave before, so that trials'
    configs (their identity, a sweep's name) are what they were."""
    return os.environ.get(CACHE_ENV, CACHE_HOME)


RESOLVER = "raystream_cache_root"
OmegaConf.register_new_resolver(RESOLVER, configured_root, replace=True)


def cache_interpolation(sub: str) -> str:
    """The same rule as an OmegaConf interpolation (a config default resolved where the config is): `<root>/<sub>`."""
    return f"${{{RESOLVER}:}}/{sub}"
