"""Where raystream keeps what it fetches or makes on a node: `$RAYSTREAM_CACHE_DIR`, else `~/.cache/raystream`.

The one place that rule is written. Under it: `videos/` (the node cache of object-store videos, data/videos/cache.py),
`demo/` (the rendered demo videos, `data.demo.cache_dir`'s default), `models/` (`models:/` starts fetched from MLflow,
train/model_uri.py), `footage/` (registry footage, data/footage.py), `starts/` and `probes/` (made by presets).
Imports nothing: the probe child process and the config schema read it.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "RAYSTREAM_CACHE_DIR"
CACHE_HOME = "~/.cache/raystream"


def cache_root() -> Path:
    """`$RAYSTREAM_CACHE_DIR`, else `~/.cache/raystream`, on the node that asks."""
    return Path(os.environ.get(CACHE_ENV) or os.path.expanduser(CACHE_HOME))


def cache_interpolation(sub: str) -> str:
    """The same rule as an OmegaConf interpolation (a config default resolved where the config is): `<root>/<sub>`."""
    return f"${{oc.env:{CACHE_ENV},'{CACHE_HOME}'}}/{sub}"
