"""raystream installs and runs where decord cannot: decord 0.6.0 (its last release) has wheels for x86_64 Linux,
x86_64 macOS and Windows only, so an aarch64 Linux GPU node (GH200, Graviton) or an Apple-silicon laptop has no
decord. pyproject.toml requires decord only where its wheels exist; PyAV is everywhere; torchcodec is an extra.

Such an environment runs in tests/test_wheel.py: the wheel is installed into a fresh venv in which decord and
torchcodec are hidden (their import fails as an uninstalled module's does), and the demo's stream and a 2-step train
run there, decoded by PyAV.
"""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement

from test_wheel import CHECKOUT

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
