"""The guard around loopback.py's use of Ray Train's private API (raystream/train/torch_backend.py), and the parts of
the loopback set-up a CPU can run: the NCCL branch's backend choice and interface (NCCL itself needs GPUs).
No Ray cluster: the guard runs on the driver before Ray Train starts."""

import importlib
import io
import os
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from ray.train.torch import TorchConfig

from raystream.train import torch_backend
from raystream.train.loopback import LoopbackTorchConfig, _use_store, backend_name, loopback_interface

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _pyproject_range() -> str:
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][torch_backend.TESTED_EXTRA]
    (ray_req,) = [Requirement(r) for r in extra if Requirement(r).name == "ray"]
    return str(ray_req.specifier)


def test_the_installed_ray_is_inside_the_tested_range_and_gets_the_loopback_set_up():
    """Fails when the installed Ray leaves pyproject's tested range (test Ray's private API again, then widen it),
    or when the installed metadata no longer matches pyproject (reinstall: pip install -e .)."""
    tested = _pyproject_range()
    assert Version(ray.__version__) in SpecifierSet(tested), f"the installed Ray {ray.__version__} is outside the tested range {tested} of {PYPROJECT}"
    assert torch_backend.tested_ray_range() == tested, "raystream's installed metadata is stale: pip install -e ."
    err = io.StringIO()
    assert isinstance(torch_backend.torch_config(err=err), LoopbackTorchConfig)
    assert err.getvalue() == ""


def test_an_untested_ray_gets_the_stock_backend_and_says_so_once():
    err = io.StringIO()
    for _ in range(2):
        config = torch_backend.torch_config(ray_version="2.99.0", err=err)
        assert type(config) is TorchConfig
    said = err.getvalue().splitlines()
    assert len(said) == 1, said
    assert "Ray 2.99.0 is outside the Ray versions raystream is tested with (<2.61,>=2.60)" in said[0]
    assert "Ray's stock TorchConfig" in said[0] and "raystream[tested-ray]" in said[0]


@pytest.mark.parametrize("version", ["2.59.2", "2.61.0", "3.0.0", "2.60.0rc1", "not-a-version"])
def test_versions_outside_the_range_are_refused(version):
    module = importlib.import_module(torch_backend.PRIVATE_MODULE)
    reason = torch_backend.loopback_unsupported(version, ">=2.60,<2.61", module)
    assert reason is not None and f"Ray {version} is outside" in reason
    assert torch_backend.loopback_unsupported("2.60.3", ">=2.60,<2.61", module) is None


def _changed(**replace):
    """Ray's ray.train.torch.config with some private names replaced (None: removed)."""
    real = importlib.import_module(torch_backend.PRIVATE_MODULE)
    names = {n: getattr(real, n) for n in ("_TorchBackend", "_set_torch_distributed_env_vars",
                                            "_setup_torch_process_group")}
    names.update(replace)
    return SimpleNamespace(__name__=real.__name__, **{k: v for k, v in names.items() if v is not None})


def test_a_changed_private_api_inside_the_range_gets_the_stock_backend():
    def setup_renamed(backend, rank, world_size, init_method, timeout_s=1800):
        pass

    class OnStartTakesMore:
        def on_start(self, worker_group, backend_config, placement):
            pass

    changes = {"missing": _changed(_set_torch_distributed_env_vars=None),
               "renamed parameter": _changed(_setup_torch_process_group=setup_renamed),
               "new required parameter": _changed(_TorchBackend=OnStartTakesMore)}
    for what, module in changes.items():
        reason = torch_backend.loopback_unsupported("2.60.0", ">=2.60,<2.61", module)
        assert reason is not None and "changed the private API" in reason, what
    assert "_set_torch_distributed_env_vars is missing" in torch_backend.private_api_change(changes["missing"])
    assert "world_rank" in torch_backend.private_api_change(changes["renamed parameter"])
    assert torch_backend.private_api_change(_changed()) is None
    err = io.StringIO()
    assert type(torch_backend.torch_config(ray_version="2.60.0", module=changes["missing"], err=err)) is TorchConfig
    assert "Ray 2.60.0 (tested range <2.61,>=2.60) changed the private API" in err.getvalue()


def test_nccl_branch_as_far_as_a_cpu_goes(monkeypatch):
    """GPU workers get NCCL with its sockets on the loopback interface (unless the user set NCCL_SOCKET_IFNAME);
    TPU workers keep Ray's set-up. NCCL's init itself needs GPUs and is not run here."""
    assert backend_name(None, {"GPU": 1, "CPU": 4}) == "nccl"
    assert backend_name(None, {"CPU": 1}) == "gloo"
    assert backend_name("gloo", {"GPU": 1}) == "gloo"
    assert backend_name(None, {"TPU": 4}) is None and backend_name("tpu_dist", {"CPU": 1}) is None
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "GLOO_SOCKET_IFNAME",
                "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(key, raising=False)
    _use_store(12345)
    assert loopback_interface() is not None
    assert os.environ["NCCL_SOCKET_IFNAME"] == os.environ["GLOO_SOCKET_IFNAME"] == loopback_interface()
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("127.0.0.1", "12345")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    _use_store(12345)
    assert os.environ["NCCL_SOCKET_IFNAME"] == "ib0"
