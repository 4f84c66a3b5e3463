"""cluster/kuberay/*.yaml parse and carry what the README promises: an autoscaling RayCluster (CPU head with no
workers' resources, GPU worker groups from 0 replicas with nvidia.com/gpu limits, token auth), a RayJob that runs
a valid `raystream sweep` on it, an MLflow server reachable in-cluster only, and no Service open to the outside.

There is no Kubernetes API server here, so the checks are structural (field names from the ray.io/v1 CRDs:
ray-operator/apis/ray/v1/raycluster_types.go, rayjob_types.go) plus composing the RayJob's overrides with
raystream's own config, which fails on any unknown key or bad value.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

KUBERAY = Path(__file__).resolve().parents[2] / "cluster" / "kuberay"


def _documents() -> Dict[str, List[dict]]:
    """kind -> objects, over every manifest file."""
    by_kind: Dict[str, List[dict]] = {}
    for path in sorted(KUBERAY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{path.name}: {doc}"
            assert doc["metadata"].get("name"), f"{path.name}: a {doc['kind']} without metadata.name"
            by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def _one(kind: str) -> dict:
    objs = _documents().get(kind, [])
    assert len(objs) == 1, f"expected one {kind}, found {len(objs)}"
    return objs[0]


def _containers(pod_template: dict) -> List[dict]:
    return pod_template["spec"]["containers"]


def test_manifests_parse_and_declare_the_expected_objects():
    kinds = {k: len(v) for k, v in _documents().items()}
    assert kinds.get("RayCluster") == 1 and kinds.get("RayJob") == 1
    assert kinds.get("Deployment") == 1 and kinds.get("Service") == 1


def test_raycluster_autoscales_gpu_groups_from_zero_with_a_head_that_trains_nothing():
    rc = _one("RayCluster")
    assert rc["apiVersion"] == "ray.io/v1"
    spec = rc["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["rayVersion"] == "2.60.0"
    assert spec["authOptions"] == {"mode": "token"}
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP" and not head.get("enableIngress")
    for group in [head] + spec["workerGroupSpecs"]:
        # KubeRay's rayStartParams is map[string]string: a YAML number there is rejected by the API server.
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), group["rayStartParams"]
    gpus = {}
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] == 0 and group.get("replicas", 0) == 0, group["groupName"]
        assert group["maxReplicas"] >= group["minReplicas"]
        (container,) = _containers(group["template"])
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"], group["groupName"]
        gpus[group["groupName"]] = limits["nvidia.com/gpu"]
    enabled = {g["groupName"] for g in spec["workerGroupSpecs"] if g["maxReplicas"] > 0}
    assert {gpus[g] for g in enabled} == {1, 8}


def test_every_ray_and_mlflow_container_uses_the_same_image_and_mlflow_service():
    rc, deploy, svc = _one("RayCluster"), _one("Deployment"), _one("Service")
    spec = rc["spec"]
    templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    images = {c["image"] for t in templates for c in _containers(t)}
    (mlflow,) = [c for c in _containers(deploy["spec"]["template"]) if c["name"] == "mlflow"]
    assert images == {mlflow["image"]}
    port = svc["spec"]["ports"][0]["port"]
    uri = f"http://{svc['metadata']['name']}:{port}"
    for t in templates:
        for c in _containers(t):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env.get("MLFLOW_TRACKING_URI") == uri, c["name"]
    assert svc["spec"]["selector"] == deploy["spec"]["template"]["metadata"]["labels"]
    args = mlflow["args"]
    assert "--host=$(POD_IP)" in args
    assert any(a.startswith("--backend-store-uri=sqlite:") for a in args)
    allowed = next(a for a in args if a.startswith("--allowed-hosts=")).split("=", 1)[1].split(",")
    assert f"{svc['metadata']['name']}:{port}" in allowed and f"localhost:{port}" in allowed


def test_no_service_or_ingress_opens_the_cluster_to_the_outside():
    docs = _documents()
    assert "Ingress" not in docs and "Route" not in docs
    for svc in docs.get("Service", []):
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
    rc = _one("RayCluster")
    assert rc["spec"]["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP"


def test_rayjob_runs_a_valid_sweep_on_the_raycluster():
    from raystream.config import compose

    job, rc, svc = _one("RayJob"), _one("RayCluster"), _one("Service")
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": rc["metadata"]["name"]}
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["raystream", "sweep"]
    cfg = compose(argv[2:])  # raises ConfigError naming the key on any unknown key or bad value
    assert cfg.trainer.use_gpu is True
    assert str(cfg.trainer.storage_path).startswith(("s3://", "gs://"))
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    port = svc["spec"]["ports"][0]["port"]
    assert runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == f"http://{svc['metadata']['name']}:{port}"
    assert spec.get("submissionMode", "K8sJobMode") in {"K8sJobMode", "HTTPMode", "SidecarMode"}


@pytest.mark.parametrize("kind", ["RayCluster", "Deployment"])
def test_pods_run_as_the_storage_service_account(kind):
    obj = _one(kind)
    if kind == "RayCluster":
        spec = obj["spec"]
        templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    else:
        templates = [obj["spec"]["template"]]
    accounts = {sa["metadata"]["name"] for sa in _documents().get("ServiceAccount", [])}
    for t in templates:
        assert t["spec"]["serviceAccountName"] in accounts
