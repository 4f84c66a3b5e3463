"""Where the Hydra config tree is: the one shipped inside the package, then a user's own directories.

The shipped tree is the checkout's top-level `sweeps/`, installed as the package `raystream._sweeps` (pyproject maps
one onto the other), so a wheel, `pip install .` or a Docker image without `-e` has every config, and an editable
install reads the checkout's files. It is found through `importlib.resources`; only a checkout imported without
being installed (on `PYTHONPATH`, as the GPU campaign runs on a bare GPU machine) reads its own `sweeps/` directly.

A user adds their own directories with `$RAYSTREAM_CONFIG_DIR` (one or more, separated by `os.pathsep`) or the
command's `--config-dir DIR`. They are searched after the shipped tree, as Hydra's own `--config-dir` is: a file they
hold under a new name (`experiment/mine.yaml`, `sweep/mine.yaml`) becomes an option; a name the shipped tree already
has stays the shipped one. Ray-free; imports no Hydra at module level.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import List, Optional

SHIPPED_PACKAGE = "raystream._sweeps"
ENV = "RAYSTREAM_CONFIG_DIR"


class ConfigTreeError(ValueError):
    """The config tree, or a user's config directory, cannot be used; the message names the path."""


def shipped_dir() -> Path:
    """The config tree shipped with the installed package (a directory on disk: pip installs wheels unpacked)."""
    try:
        root = resources.files(SHIPPED_PACKAGE)
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[1] / "sweeps"
        if (checkout / "config.yaml").is_file():  # a source checkout on PYTHONPATH, not installed
            return checkout
        raise ConfigTreeError(f"the installed raystream has no config tree (package `{SHIPPED_PACKAGE}` is missing): "
                              "reinstall it (`pip install raystream` or `make install` in a checkout)") from None
    if not isinstance(root, Path) or not (root / "config.yaml").is_file():
        raise ConfigTreeError(f"the config tree of the installed raystream ({root}) holds no config.yaml: reinstall it")
    return root


def user_dirs() -> List[Path]:
    """The user's own config directories, from `$RAYSTREAM_CONFIG_DIR`, in order; each must exist."""
    dirs = [Path(p).expanduser().resolve() for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]
    for d in dirs:
        if not d.is_dir():
            raise ConfigTreeError(f"config directory {d} (from ${ENV} or --config-dir) is not a directory")
    return dirs


def add_user_dirs(dirs: List[str]) -> None:
    """Put the `--config-dir` directories before those already in `$RAYSTREAM_CONFIG_DIR` (none: nothing changes).

    Through the environment, so that every compose in this process and in the Ray workers it starts sees them."""
    if not dirs:
        return
    current = [p for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]
    os.environ[ENV] = os.pathsep.join([str(Path(d).expanduser().resolve()) for d in dirs] + current)
    user_dirs()  # a missing directory fails here, naming it


def search_path() -> List[Path]:
    """Every config directory in the order Hydra searches them: the shipped tree, then the user's own."""
    return [shipped_dir(), *user_dirs()]


def find(relative: str) -> Optional[Path]:
    """The first file `relative` (e.g. `sweep/smoke.yaml`) in the search path, the one Hydra composes; None if none."""
    return next((root / relative for root in search_path() if (root / relative).is_file()), None)
