"""Shared pieces of the deploy checks: every kustomization rendered once per session, and the
pod specs inside them (Deployments, StatefulSets, Jobs, ...)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
# The overlays that ship the monitoring component (all of them: test_deploy_operations).
MONITORED = [o for o in OVERLAYS if "/monitoring" in (o / "kustomization.yaml").read_text()]
GPU_OVERLAYS = [o for o in OVERLAYS if o.name != "cpu-offline"]
# GPU overlays whose engines share one ReadWriteMany weights volume (the others keep a copy
# per engine: components/model-weights-per-engine).
SHARED_WEIGHTS = [
    o
    for o in GPU_OVERLAYS
    if "model-weights-per-engine" not in (o / "kustomization.yaml").read_text()
]
KUSTOMIZATIONS = [
    *OVERLAYS,
    K8S / "agent-memory",
    DEPLOY / "helm" / "loopstack-layer",
]
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")

Doc = dict[str, Any]


def kustomize(path: Path) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed on this machine")
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Doc]]:
    return {str(p.relative_to(ROOT)): kustomize(p) for p in KUSTOMIZATIONS}


def pod_specs(docs: list[Doc]) -> Iterator[tuple[str, Doc, Doc]]:
    """(kind/name, the workload, its pod spec) for every object that makes pods."""
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc, doc["spec"]["template"]["spec"]
        elif doc["kind"] == "CronJob":
            spec = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            yield f"CronJob/{doc['metadata']['name']}", doc, spec
        elif doc["kind"] == "Pod":
            yield f"Pod/{doc['metadata']['name']}", doc, doc["spec"]


def containers(spec: Doc) -> list[Doc]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def by_kind(docs: list[Doc], kind: str, name: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name))


def container_env(docs: list[Doc], c: Doc) -> dict[str, str]:
    """A container's environment as the kubelet builds it: envFrom ConfigMaps, then `env`
    (values, and values from ConfigMap keys); Secret values show as ``<secret>``."""
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        name = src.get("configMapRef", {}).get("name")
        if name:
            env.update(maps[name])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "configMapKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = maps[ref["name"]][ref["key"]]
        else:
            env[e["name"]] = "<secret>"
    return env


def expanded_command(docs: list[Doc], c: Doc) -> str:
    """A container's command and args as the kubelet runs them: ``$(VAR)`` from its env."""
    env = container_env(docs, c)
    words = [*c.get("command", []), *c.get("args", [])]
    return " ".join(
        re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), w) for w in words
    )
