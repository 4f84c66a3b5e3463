"""cluster/aws.yaml and cluster/gcp.yaml pass Ray's own cluster-launcher validation, offline, and say what the
README promises: a CPU head that trains nothing, 1x and 8x GPU worker types starting at 0 nodes, spot /
preemptible variants, raystream installed by setup_commands, token auth and a loopback-only dashboard.

Validation is what `ray up` runs before touching a cloud: `prepare_config` merges the provider's defaults
(ray/autoscaler/<provider>/defaults.yaml) and `validate_config` checks the result against the autoscaler's JSON
schema (ray/autoscaler/ray-schema.json) plus its cross-field rules. The raw file is also checked against the schema,
so a key Ray would silently take from its defaults cannot hide a typo.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
LAUNCHER_CONFIGS = {"aws": CLUSTER / "aws.yaml", "gcp": CLUSTER / "gcp.yaml"}


def _load(provider: str) -> dict:
    return yaml.safe_load(LAUNCHER_CONFIGS[provider].read_text())


def _prepared(provider: str) -> dict:
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(copy.deepcopy(_load(provider)))


def _commands(lines) -> str:
    return "\n".join(lines)


def _flags(command_text: str, program: str):
    """`--flag` names given to `program` (e.g. "ray start") in a shell command text."""
    found = set()
    head = program.split()
    for part in re.split(r"[;&|\n]+", command_text):
        try:
            words = shlex.split(part)
        except ValueError:  # a fragment of a quoted pipeline (awk '{...}'): holds no command of interest
            continue
        for i in range(len(words) - len(head) + 1):
            if words[i:i + len(head)] == head:
                found |= {w.split("=", 1)[0] for w in words[i + len(head):] if w.startswith("--")}
    return found


@pytest.mark.parametrize("provider", sorted(LAUNCHER_CONFIGS))
def test_launcher_config_passes_rays_validation(provider):
    from ray.autoscaler._private.util import validate_config

    schema = json.loads((Path(__import__("ray.autoscaler", fromlist=["x"]).__file__).parent
                         / "ray-schema.json").read_text())
    raw = _load(provider)
    jsonschema.validate(raw, schema)  # the file as written: no unknown keys, right types
    validate_config(_prepared(provider))  # what `ray up` would run with: defaults merged, cross-field rules


@pytest.mark.parametrize("provider", sorted(LAUNCHER_CONFIGS))
def test_head_trains_nothing_and_gpu_types_scale_from_zero(provider):
    cfg = _prepared(provider)
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"].get("CPU") == 0 and not head["resources"].get("GPU")
    assert "--num-cpus=0" in _commands(cfg["head_start_ray_commands"])
    workers = {name: t for name, t in types.items() if name != cfg["head_node_type"]}
    assert workers and all(t["min_workers"] == 0 for t in workers.values())
    assert {t["resources"].get("GPU") for t in workers.values()} == {1, 8}
    assert cfg["idle_timeout_minutes"] > 0
    # The bill's ceiling: the global max_workers bounds the types' sum.
    assert 0 < cfg["max_workers"] <= sum(t["max_workers"] for t in workers.values())


@pytest.mark.parametrize("provider", sorted(LAUNCHER_CONFIGS))
def test_spot_or_preemptible_variants_are_offered_but_off(provider):
    types = _prepared(provider)["available_node_types"]
    if provider == "aws":
        spot = {n for n, t in types.items()
                if t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"}
    else:
        spot = {n for n, t in types.items() if t["node_config"].get("scheduling", {}).get("preemptible") is True}
    assert {types[n]["resources"]["GPU"] for n in spot} == {1, 8}
    assert all(types[n]["max_workers"] == 0 for n in spot)  # opt-in: README says how


@pytest.mark.parametrize("provider", sorted(LAUNCHER_CONFIGS))
def test_nodes_install_raystream_and_run_with_token_auth_and_loopback_dashboard(provider):
    cfg = _prepared(provider)
    setup = _commands(cfg["setup_commands"])
    assert "-e ~/raystream" in setup and "ray[default" in setup
    mounts = cfg["file_mounts"]
    for path in ("pyproject.toml", "README.md", "raystream", "sweeps"):  # what `pip install -e` needs, no more
        assert mounts.get(f"~/raystream/{path}") == path
        assert (CLUSTER.parent / path).exists(), path
    assert cfg["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    head, worker = _commands(cfg["head_start_ray_commands"]), _commands(cfg["worker_start_ray_commands"])
    for text in (head, worker):
        assert "export RAY_AUTH_MODE=token" in text
        assert "MLFLOW_TRACKING_URI=http://" in text
    assert "--dashboard-host=127.0.0.1" in head
    # MLflow on the head listens on its private address, never on every interface.
    assert "--host $HEAD_IP" in head and "HEAD_IP=$(python -c 'import ray.util; print(ray.util.get_node_ip_address())')" in head


@pytest.mark.parametrize("provider", sorted(LAUNCHER_CONFIGS))
def test_start_commands_use_real_ray_and_mlflow_flags(provider):
    """Every `--flag` given to `ray start` and `mlflow server` exists in the installed CLIs (typos fail `ray up`
    only after the machines are paid for)."""
    from mlflow.cli import server as mlflow_server
    from ray.scripts.scripts import start as ray_start

    known = {"ray start": {o for p in ray_start.params for o in p.opts},
             "mlflow server": {o for p in mlflow_server.params for o in p.opts}}
    cfg = _prepared(provider)
    text = _commands(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"])
    for program, options in known.items():
        used = _flags(text, program)
        assert used, f"no `{program}` in the start commands"
        assert used <= options, f"unknown `{program}` flags: {sorted(used - options)}"


@pytest.mark.parametrize("provider", sorted(LAUNCHER_CONFIGS))
def test_node_commands_are_valid_bash(provider):
    """Each command the launcher runs over SSH parses as bash (`bash -n`: syntax only, nothing runs)."""
    import subprocess

    cfg = _prepared(provider)
    for key in ("initialization_commands", "setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        for command in cfg[key]:
            done = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
            assert done.returncode == 0, f"{key}: {command}\n{done.stderr}"
