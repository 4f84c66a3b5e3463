"""A wheel is a whole install: built from the checkout, installed WITHOUT -e into a fresh virtual environment and run
from a directory outside the checkout, `raystream` finds its configs (package data), inspects the demo and trains.

That environment is also a machine without decord (an aarch64 GPU node, an Apple-silicon laptop: decord 0.6.0 has no
wheel there; tests/test_install_without_decord.py checks the requirement markers): decord and torchcodec are hidden
in it (their import fails as an uninstalled module's does), so the demo's stream and the tiny train are decoded by
PyAV, the decoder every platform has.

Offline: the wheel is built with the test environment's setuptools (no build isolation) and installed with no
index; the fresh environment takes its third-party dependencies from the test environment (a .pth naming its
site-packages), but raystream itself only from the wheel, which the first test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
# What a build reads: the metadata, the licence, the package and the config tree it maps into the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "raystream", "sweeps")
# What a machine without decord's wheels lacks (torchcodec is an extra): hidden in the wheel's environment.
HIDDEN = ("decord", "torchcodec")
# The tiny run of tests/train/conftest.py TINY, cut to two steps.
TINY_TRAIN = ["stream.batch_size=4", "trainer.max_steps=2", "trainer.checkpoint_every=2", "trainer.log_every=1",
              "trainer.report_every=2", "eval.metrics=[]", "trainer.correlation_steps=1", "optimizer.warmup_steps=1"]


def _inside_checkout(path: str) -> bool:
    try:
        return Path(path).resolve().is_relative_to(CHECKOUT)
    except OSError:
        return False


def _site_packages(path: str) -> bool:
    """A venv's or the system's site-packages (the test venv lives in the checkout on CI: `make test` makes .venv)."""
    return Path(path).name in ("site-packages", "dist-packages")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-3000:]}\n" \
                                f"{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout's build inputs (a build writes build/ and egg-info beside them)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        assert (CHECKOUT / name).exists(), f"{name} is missing from the checkout"
        if (CHECKOUT / name).is_dir():
            shutil.copytree(CHECKOUT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(CHECKOUT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
          str(root / "dist"), str(src)])
    (built,) = (root / "dist").glob("raystream-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict:
    """A fresh venv holding the wheel, without decord or torchcodec; `home` is a directory outside the checkout to run
    commands in."""
    root = tmp_path_factory.mktemp("venv")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = Path(_run([str(venv / "bin" / "python"), "-c",
                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # Only site-packages: the test venv's .pth files (its editable raystream among them) are not read from a path
    # listed in another .pth, so raystream can come only from the wheel (checked below).
    deps = [p for p in sys.path if _site_packages(p)]
    (purelib / "test_env_deps.pth").write_text("\n".join(deps) + "\n")
    for name in HIDDEN:  # found before the test environment's copy, and its import fails as a missing module's does
        (purelib / name).mkdir()
        (purelib / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index",
          str(wheel)])
    home = root / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RAYSTREAM_CONFIG_DIR", "MLFLOW_TRACKING_URI", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {"venv": venv, "purelib": purelib, "home": home, "env": env}


def _raystream(installed, *args, timeout=300) -> subprocess.CompletedProcess:
    return _run([str(installed["venv"] / "bin" / "raystream"), *args], cwd=installed["home"], env=installed["env"],
                timeout=timeout)


def test_the_wheel_holds_every_module_the_config_tree_and_the_licence(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(CHECKOUT)) for p in (CHECKOUT / "raystream").rglob("*.py")}
    configs = {f"raystream/_sweeps/{p.relative_to(CHECKOUT / 'sweeps')}" for p in (CHECKOUT / "sweeps").rglob("*.yaml")}
    assert configs and modules - names == set() and configs - names == set()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


@pytest.mark.slow
def test_raystream_comes_from_the_wheel_and_finds_its_configs_outside_the_checkout(installed):
    out = _run([str(installed["venv"] / "bin" / "python"), "-c",
                "import json, os, sys, raystream; from raystream.config import config_dir; "
                "from raystream.data.decode.backends import installed_decoders; "
                "print(json.dumps([raystream.__file__, str(config_dir()), [os.path.abspath(p) for p in sys.path], "
                "installed_decoders()]))"],
               cwd=installed["home"], env=installed["env"])
    module, configs, path, decoders = json.loads(out.stdout)
    assert decoders == ["pyav"]  # no decord, no torchcodec: PyAV decodes everything below
    assert Path(module).is_relative_to(installed["purelib"])
    assert Path(configs) == installed["purelib"] / "raystream" / "_sweeps"
    assert not [p for p in path if _inside_checkout(p) and not _site_packages(p)], "the checkout is on sys.path"
    job = _raystream(installed, "train", "--cfg", "job", "optimizer=adamw")
    assert "name: adamw" in job.stdout and "experiment: default" in job.stdout


@pytest.mark.slow
def test_data_inspect_of_the_demo_from_the_wheel(installed):
    out = _raystream(installed, "data", "inspect", "--batches", "2")
    batches = [json.loads(line) for line in out.stdout.splitlines()]
    assert [b["step"] for b in batches] == [0, 1] and all(b["clips"] for b in batches)  # decoded by PyAV


@pytest.mark.slow
def test_a_tiny_train_from_the_wheel(installed):
    home = installed["home"]
    out = _raystream(installed, "train", *TINY_TRAIN, f"trainer.storage_path={home / 'results'}",
                     f"mlflow.tracking_uri=sqlite:///{home / 'mlflow.db'}", timeout=600)
    assert "2 steps" in out.stdout
    assert list((home / "results").glob("*/checkpoint_00000002"))
