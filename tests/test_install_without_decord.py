"""raystream installs and runs where decord cannot: decord 0.6.0 (its last release) has wheels for x86_64 Linux,
x86_64 macOS and Windows only, so an aarch64 Linux GPU node (GH200, Graviton) or an Apple-silicon laptop has no
decord. pyproject.toml requires decord only where its wheels exist; PyAV is everywhere; torchcodec is an extra.

The second test builds such an environment here: a fresh venv with this one's packages except decord and torchcodec
(their import fails as an uninstalled module's does), installs raystream into it (editable, offline, no
dependencies), and runs the demo's stream and a 2-step train there, decoded by PyAV.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from test_wheel import CHECKOUT, TINY_TRAIN, _run

PLATFORMS = {  # the environment markers of each machine (PEP 508)
    "x86_64 Linux": {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux"},
    "aarch64 Linux (GH200, Graviton)": {"platform_system": "Linux", "platform_machine": "aarch64",
                                        "sys_platform": "linux"},
    "x86_64 macOS": {"platform_system": "Darwin", "platform_machine": "x86_64", "sys_platform": "darwin"},
    "Apple silicon": {"platform_system": "Darwin", "platform_machine": "arm64", "sys_platform": "darwin"},
    "Windows": {"platform_system": "Windows", "platform_machine": "AMD64", "sys_platform": "win32"},
}
DECORD_WHEELS = {"x86_64 Linux", "x86_64 macOS", "Windows"}


def _project() -> dict:
    with open(CHECKOUT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def test_decord_is_required_only_where_it_has_wheels_and_pyav_everywhere():
    reqs = [Requirement(r) for r in _project()["dependencies"]]
    for platform, markers in PLATFORMS.items():
        env = {"python_version": "3.11", "python_full_version": "3.11.7", "os_name": "posix", **markers}
        names = {r.name for r in reqs if r.marker is None or r.marker.evaluate(env)}
        assert ("decord" in names) == (platform in DECORD_WHEELS), platform
        assert "av" in names, platform
    (torchcodec,) = [Requirement(r) for r in _project()["optional-dependencies"]["torchcodec"]]
    # PyPI's 0.12 and 0.13 are the CPU builds that load beside the CPU torch 2.13 wheel; 0.14+ need CUDA
    assert torchcodec.name == "torchcodec" and torchcodec.specifier.contains("0.13.0")
    assert not torchcodec.specifier.contains("0.14.0") and not torchcodec.specifier.contains("0.11.1")


def _venv_without(root: Path, hidden: tuple) -> Path:
    """A venv taking its third-party packages from this environment (a .pth naming its site-packages, as
    tests/test_wheel.py does) in which the modules `hidden` are not found: each is shadowed by a package whose import
    raises ModuleNotFoundError, as `import decord` does where decord is not installed."""
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = Path(_run([str(venv / "bin" / "python"), "-c",
                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (purelib / "test_env_deps.pth").write_text("\n".join(deps) + "\n")
    for name in hidden:
        (purelib / name).mkdir()
        (purelib / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    return venv


@pytest.mark.slow
def test_without_decord_the_demo_streams_and_trains(tmp_path):
    venv = _venv_without(tmp_path, ("decord", "torchcodec"))
    python = str(venv / "bin" / "python")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-build-isolation",
          "--no-index", "-e", str(CHECKOUT)])
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RAYSTREAM_CONFIG_DIR", "MLFLOW_TRACKING_URI", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    found = _run([python, "-c", "import raystream; from raystream.data.decode.backends import installed_decoders as d; "
                  "print(raystream.__file__, d())"], cwd=home, env=env).stdout.split()
    assert found == [str(CHECKOUT / "raystream" / "__init__.py"), "('pyav',)"]
    raystream = str(venv / "bin" / "raystream")
    inspect = _run([raystream, "data", "inspect", "--batches", "2"], cwd=home, env=env)
    assert len(inspect.stdout.splitlines()) == 2
    train = _run([raystream, "train", *TINY_TRAIN, f"trainer.storage_path={home / 'results'}",
                  f"mlflow.tracking_uri=sqlite:///{home / 'mlflow.db'}"], cwd=home, env=env, timeout=400)
    assert "2 steps" in train.stdout
    assert list((home / "results").glob("*/checkpoint_00000002"))
