"""An upgrade from the previous release (issue 41, item 2): what `kubectl apply -k` of today's
manifests does to objects the previous release's manifests made.

The reference is a fixture committed beside this file (``fixtures/previous-release.yaml``):
for each kustomization of the previous release, every workload that set ``replicas``, and the
fields of each StatefulSet that the API server refuses to change. It was rendered from the
manifests at ``PREVIOUS`` (``write_fixture`` below); where git has that commit, a test renders
it again and compares. Any object that lost ``replicas`` since (client-side apply would reset
it to 1 once: the last-applied annotation still holds the old value) and any StatefulSet whose
immutable fields changed (apply fails: "Forbidden") must be named in docs/deploy.md's upgrade
section, which says what to do with it."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.conftest import ROOT, Doc, kustomize

# The manifests before issue 35's changes (the parent of 929cb01): the previous release.
PREVIOUS = "6be4707"
FIXTURE = Path(__file__).with_name("fixtures") / "previous-release.yaml"
DOC = ROOT / "docs/deploy.md"
# The kustomizations a team applies (their paths then and now are the same).
APPLIED = [
    "deploy/k8s/overlays/qwen2.5-7b",
    "deploy/k8s/overlays/qwen2.5-7b-hpa",
    "deploy/k8s/overlays/qwen2.5-32b-tp2",
    "deploy/k8s/agent-memory",
    "deploy/helm/loopstack-layer",
]
# StatefulSet fields an update may not change (the API server's validation).
STS_IMMUTABLE = ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy")


def summary(docs: list[Doc]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec, entry = d["spec"], {}
        if "replicas" in spec:
            entry["replicas"] = spec["replicas"]
        if d["kind"] == "StatefulSet":
            entry["immutable"] = {f: spec.get(f) for f in STS_IMMUTABLE}
        if entry:
            out[f"{d['kind']}/{d['metadata']['name']}"] = entry
    return out


def render_tree(root: Path) -> dict[str, Any]:
    return {k: summary(kustomize(root / k)) for k in APPLIED if (root / k).is_dir()}


def write_fixture(tmp: Path) -> dict[str, Any]:
    """Renders the previous release's manifests from git (python -c 'from
    tests.unit.deploy.test_deploy_upgrade import *; ...' regenerates the fixture)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS, "deploy"], capture_output=True, timeout=60
    )
    if archive.returncode != 0:
        pytest.skip(f"git has no commit {PREVIOUS} here (a shallow clone?)")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp, filter="data")
    return {"reference": PREVIOUS, "kustomizations": render_tree(tmp)}


def upgrade_section() -> str:
    text = DOC.read_text()
    start = text.index("## 9. Upgrading from the previous release")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_fixture_is_the_previous_release_rendered(tmp_path: Path) -> None:
    fresh = write_fixture(tmp_path)
    assert yaml.safe_load(FIXTURE.read_text()) == fresh


def test_every_object_that_lost_replicas_or_changed_an_immutable_field_is_in_the_docs() -> None:
    old = yaml.safe_load(FIXTURE.read_text())["kustomizations"]
    now = render_tree(ROOT)
    section = upgrade_section().lower()
    lost, frozen = set(), set()
    for k, objects in old.items():
        for name, entry in objects.items():
            cur = now.get(k, {}).get(name)
            if cur is None:
                continue
            if "replicas" in entry and "replicas" not in cur:
                lost.add(name.lower())
            if entry.get("immutable") != cur.get("immutable"):
                frozen.add(name.lower())
    assert lost, "the reference should show the engines' replicas handed to the autoscaler"
    missing = sorted(n for n in lost | frozen if n not in section)
    assert not missing, f"docs/deploy.md's upgrade section does not name {missing}"


def test_the_check_sees_an_object_that_loses_replicas() -> None:
    old = yaml.safe_load(FIXTURE.read_text())["kustomizations"]
    router = old["deploy/k8s/overlays/qwen2.5-7b"]["Deployment/vllm-router"]
    assert router["replicas"] == 2  # had it then, has it now: not named, and need not be
    assert "deployment/vllm-router" not in upgrade_section().lower()


def test_the_docs_one_time_step_creates_the_engines_at_the_running_size(
    rendered: dict[str, list[Doc]],
) -> None:
    """The python3 filter of the docs' step, fed what `kubectl create --dry-run=client -o json`
    prints for the rendered overlay (a List)."""
    import json
    import re
    import sys

    m = re.search(r"python3 -c '([^']+)' \"\$N\"", upgrade_section())
    assert m, "the one-time step's filter is not in the upgrade section"
    docs = rendered["deploy/k8s/overlays/qwen2.5-7b"]
    listing = json.dumps({"kind": "List", "items": docs})
    out = subprocess.run(
        [sys.executable, "-c", m.group(1), "3"], input=listing, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    sts = json.loads(out.stdout)
    expected = next(
        d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "vllm"
    )
    assert sts["spec"].pop("replicas") == 3
    assert sts == expected
