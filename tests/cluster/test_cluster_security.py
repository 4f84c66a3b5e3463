"""Nothing secret in cluster/, and nothing there opens the dashboard / job API or MLflow on every interface.

The secret scan looks for the shapes real credentials have (cloud access keys, private keys, service-account
JSON, API tokens, a literal assigned to a password/secret/token-like key). The bind check covers the files as
written and, for the launcher configs, what `ray up` runs after merging Ray's provider defaults (whose own
head_start_ray_commands pass --dashboard-host=0.0.0.0).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import List, Tuple

import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"

SECRET_PATTERNS = {
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|A3T[A-Z0-9])[A-Z0-9]{16}\b"),
    "AWS secret key assignment": re.compile(r"aws_secret_access_key\s*[=:]\s*\S+", re.I),
    "private key block": re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
    "GCP service-account key": re.compile(r"\"type\"\s*:\s*\"service_account\"|\"private_key(?:_id)?\"\s*:"),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b|\bgithub_pat_[A-Za-z0-9_]{22,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),
    "bearer token": re.compile(r"\bBearer\s+[A-Za-z0-9._\-]{20,}"),
    # A literal (not a $VAR, ~/path or <placeholder>) of 16+ token characters given to a secret-like key,
    # e.g. RAY_AUTH_TOKEN=..., password: "...", MLFLOW_TRACKING_PASSWORD: ...
    "secret-like assignment": re.compile(
        r"(?i)\b[\w.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key)[\w.-]*\b['\"]?\s*[:=]\s*"
        r"['\"]?(?![$~<{(])[A-Za-z0-9+/_\-=]{16,}"),
}
# A Kubernetes env entry whose value is a literal (instead of valueFrom) for a secret-like variable.
SECRET_ENV = re.compile(r"(?i)(password|secret|token|api_?key|access_?key)")
EVERY_INTERFACE = re.compile(r"0\.0\.0\.0|(?<![\w:])\[?::\]?(?![\w:])")


def _files() -> List[Path]:
    """The shipped files (bytecode caches aside)."""
    return sorted(p for p in CLUSTER.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"))


def _secrets_in(text: str) -> List[Tuple[str, str]]:
    return [(name, m.group(0)) for name, rx in SECRET_PATTERNS.items() for m in rx.finditer(text)]


def test_cluster_folder_holds_the_shipped_files():
    names = {p.relative_to(CLUSTER).as_posix() for p in _files()}
    assert {"aws.yaml", "gcp.yaml", "kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "README.md"} <= names


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.relative_to(CLUSTER).as_posix())
def test_no_secrets_in_cluster_files(path):
    text = path.read_text(errors="replace")
    assert not _secrets_in(text)
    if path.suffix in (".yaml", ".yml"):
        for doc in yaml.safe_load_all(text):
            for name, value in _literal_envs(doc):
                assert not SECRET_ENV.search(name), f"{path.name}: env {name} has a literal value: use valueFrom"


def _literal_envs(node):
    """(name, value) of every Kubernetes env entry with a literal value."""
    if isinstance(node, dict):
        if "name" in node and "value" in node and set(node) <= {"name", "value"}:
            yield node["name"], node["value"]
        for v in node.values():
            yield from _literal_envs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _literal_envs(v)


@pytest.mark.parametrize("path", [p for p in _files() if p.name != "README.md"],
                         ids=lambda p: p.relative_to(CLUSTER).as_posix())
def test_no_shipped_config_binds_every_interface(path):
    text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())  # comments aside
    assert not EVERY_INTERFACE.search(text), f"{path.name} binds every interface"


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_launcher_config_after_rays_defaults_binds_no_service_to_every_interface(name):
    from ray.autoscaler._private.util import prepare_config

    prepared = prepare_config(copy.deepcopy(yaml.safe_load((CLUSTER / name).read_text())))
    commands = json.dumps(prepared["head_start_ray_commands"] + prepared["worker_start_ray_commands"])
    assert not EVERY_INTERFACE.search(commands)
    assert "--dashboard-host=127.0.0.1" in commands
    assert "0.0.0.0" not in json.dumps(prepared)
