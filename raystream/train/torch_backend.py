"""Which torch.distributed set-up a run gets: raystream's loopback one, or Ray's stock `TorchConfig`.

`raystream/train/loopback.py` subclasses Ray Train's private `_TorchBackend` and calls two private functions of
`ray.train.torch.config`. Private names can change in any Ray release, so `torch_config()` (what `fit` passes to the
`TorchTrainer`) uses it only on a Ray version raystream is tested with (the `tested-ray` extra of pyproject.toml,
read from raystream's installed metadata) whose private names still take the arguments loopback.py passes them.
Otherwise the run gets Ray's stock `TorchConfig`, and the driver says so once on stderr, naming the Ray version and
the tested range: the run works, but on one node torch's rendezvous store listens on every interface of rank 0's
node instead of 127.0.0.1 only (docs/operations.md). The checks are plain functions of a version string and a module,
so a test can give them an untested version or a changed module.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from importlib import metadata
from types import ModuleType
from typing import Optional, Set, TextIO

import ray
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from ray.train.torch import TorchConfig

from raystream.train.loopback import LoopbackTorchConfig

DISTRIBUTION = "raystream"
TESTED_EXTRA = "tested-ray"  # pyproject.toml: [project.optional-dependencies] tested-ray = ["ray[...]>=A,<B"]
PRIVATE_MODULE = "ray.train.torch.config"
# The private names loopback.py uses, each with the keyword arguments it is called with.
PRIVATE_API = {
    "_TorchBackend.on_start": ("self", "worker_group", "backend_config"),
    "_set_torch_distributed_env_vars": (),
    "_setup_torch_process_group": ("backend", "world_rank", "world_size", "init_method", "timeout_s"),
}
_SAID: Set[str] = set()  # the fallback reasons already said by this process


def tested_ray_range() -> Optional[str]:
    """The Ray versions raystream is tested with (a specifier such as `<2.61,>=2.60`), from the `tested-ray` extra
    of raystream's installed metadata; None when raystream's metadata is not installed."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return None
    for text in requires:
        req = Requirement(text)
        if req.name == "ray" and req.marker is not None and req.marker.evaluate({"extra": TESTED_EXTRA}):
            return str(req.specifier)
    return None


def private_api_change(module: ModuleType) -> Optional[str]:
    """What of `PRIVATE_API` `module` (Ray's `ray.train.torch.config`) lacks, or no longer accepts the arguments
    loopback.py passes; None when all of it is there."""
    for dotted, kwargs in PRIVATE_API.items():
        obj: object = module
        for part in dotted.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return f"{module.__name__}.{dotted} is missing"
        try:
            inspect.signature(obj).bind(**dict.fromkeys(kwargs))
        except (TypeError, ValueError) as exc:
            return f"{module.__name__}.{dotted} no longer takes ({', '.join(kwargs)}): {exc}"
    return None


def loopback_unsupported(ray_version: str, tested: Optional[str], module: ModuleType) -> Optional[str]:
    """Why the loopback set-up is not used with Ray `ray_version` (a sentence), or None when it is: `tested` is the
    tested range (None: unknown), `module` Ray's `ray.train.torch.config`."""
    if tested is None:
        return (f"Ray {ray_version} is used, and the Ray versions raystream is tested with are unknown (raystream's "
                f"package metadata is not installed: pip install -e .)")
    try:
        inside = Version(ray_version) in SpecifierSet(tested)
    except InvalidVersion:
        inside = False
    if not inside:
        return f"Ray {ray_version} is outside the Ray versions raystream is tested with ({tested})"
    change = private_api_change(module)
    if change is not None:
        return (f"Ray {ray_version} (tested range {tested}) changed the private API raystream/train/loopback.py "
                f"reuses: {change}")
    return None


def torch_config(ray_version: Optional[str] = None, tested: Optional[str] = None,
                 module: Optional[ModuleType] = None, err: Optional[TextIO] = None):
    """The `TorchConfig` of a run: `LoopbackTorchConfig` when `loopback_unsupported` finds nothing, else Ray's
    stock `TorchConfig`, said once per reason on `err` (stderr). The arguments default to the installed Ray, the
    installed tested range and Ray's `ray.train.torch.config`."""
    reason = loopback_unsupported(ray_version or ray.__version__, tested or tested_ray_range(),
                                  module or importlib.import_module(PRIVATE_MODULE))
    if reason is None:
        return LoopbackTorchConfig()
    if reason not in _SAID:
        _SAID.add(reason)
        print(f"raystream: {reason}. torch.distributed is set up by Ray's stock TorchConfig instead of raystream's "
              f"loopback set-up: on one node, its rendezvous store listens on every interface of rank 0's node, not "
              f"on 127.0.0.1 only (docs/operations.md). `pip install \"raystream[{TESTED_EXTRA}]\"` installs a "
              f"tested Ray.", file=err or sys.stderr, flush=True)
    return TorchConfig()
