"""The weights on a running cluster (issue 41, items 3-5): a fetch Job keyed by model that no
image bump makes immutable-fail, a completion marker per model that the pods wait for, a
storage class that must be chosen (checked when rendering), and a Job that writes where its
uid can or says why not. The Job's script and the pods' wait commands run here for real
(the script as uid 10001, with a stand-in for huggingface_hub's download)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.unit.deploy.conftest import (
    DEPLOY,
    ROOT,
    SHARED_WEIGHTS,
    Doc,
    by_kind,
    container_env,
    kustomize,
)

SEVEN_B = "deploy/k8s/overlays/qwen2.5-7b"
WEIGHTED = [*(str(o.relative_to(ROOT)) for o in SHARED_WEIGHTS), "deploy/helm/loopstack-layer"]
PER_ENGINE = "deploy/k8s/overlays/qwen2.5-7b-rwo"
MARKER = ".loopstack-complete"
UID = 10001


def fetch_job(docs: list[Doc]) -> Doc:
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    return jobs[0]


def render_edited(tmp: Path, edits: dict[str, tuple[str, str]], path: str = SEVEN_B) -> list[Doc]:
    """The manifests rendered after replacing text in files of a copy of deploy/."""
    copy = tmp / f"copy{len(list(tmp.iterdir()))}"
    shutil.copytree(DEPLOY, copy / "deploy")
    for rel, (old, new) in edits.items():
        f = copy / rel
        assert old in f.read_text(), (rel, old)
        f.write_text(f.read_text().replace(old, new))
    return kustomize(copy / path)


# ------------------------------------------------------------------- 3. keyed by the model
IMAGES = "deploy/k8s/components/images/kustomization.yaml"
OVERLAY = f"{SEVEN_B}/kustomization.yaml"


@pytest.mark.parametrize(
    ("edit", "new_job"),
    [
        ((IMAGES, ("newTag: 0.1.0-cpu", "newTag: 0.2.0-cpu")), False),  # our version bump
        ((OVERLAY, ("MODEL_REVISION=main", "MODEL_REVISION=a1b2c3d")), True),
        ((OVERLAY, ("MODEL_REPO=Qwen/Qwen2.5-7B-Instruct", "MODEL_REPO=Qwen/Qwen3-8B")), True),
        ((OVERLAY, ("MODEL_DIR=/models/Qwen/Qwen2.5-7B-Instruct", "MODEL_DIR=/models/b")), True),
        ((OVERLAY, ("vllm-openai:v0.33.0  # the Job", "vllm-openai:v0.34.0  # the Job")), True),
        (("deploy/k8s/components/model-weights/fetch.py", ("print(f", "print('x', f")), True),
    ],
    ids=["image-bump", "revision", "repo", "folder", "fetch-image", "fetch-script"],
)
def test_a_change_makes_a_new_job_and_never_changes_an_existing_one(
    rendered: dict[str, list[Doc]], tmp_path: Path, edit: tuple[str, tuple[str, str]], new_job: bool
) -> None:
    """A Job's pod template is immutable: `kubectl apply` of the same name with another
    template fails. So the template may change only with the name."""
    before = fetch_job(rendered[SEVEN_B])
    after = fetch_job(render_edited(tmp_path, dict([edit])))
    if new_job:
        assert after["metadata"]["name"] != before["metadata"]["name"]
    else:
        assert after == before
    if after["metadata"]["name"] == before["metadata"]["name"]:
        assert after["spec"]["template"] == before["spec"]["template"]


def test_the_job_fetches_what_the_pods_load(rendered: dict[str, list[Doc]]) -> None:
    for path in WEIGHTED:
        docs = rendered[path]
        job = fetch_job(docs)
        assert job["metadata"]["name"].startswith("model-fetch-")
        env = container_env(docs, job["spec"]["template"]["spec"]["containers"][0])
        weights = by_kind(docs, "ConfigMap", "model-weights")["data"]
        for key in ("MODEL_REPO", "MODEL_REVISION", "MODEL_DIR", "HF_ENDPOINT", "FETCH_IMAGE"):
            assert env[key] == weights[key], (path, key)
        assert job["spec"]["template"]["spec"]["containers"][0]["image"] == weights["FETCH_IMAGE"]
        assert job["spec"]["ttlSecondsAfterFinished"] > 0


# ------------------------------------------------- the marker: the pods wait for their model
def wait_commands(docs: list[Doc]) -> list[tuple[str, Doc, dict[str, str]]]:
    out = []
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in d["spec"]["template"]["spec"].get("initContainers", []):
            if c["name"] == "wait-for-weights":
                out.append((f"{d['kind']}/{d['metadata']['name']}", c, container_env(docs, c)))
    return out


def run_wait(c: Doc, env: dict[str, str], model_dir: Path) -> int:
    """The init container's command for 2 s: 0 once it lets the pod start, 124 while waiting."""
    argv = [*c["command"], *c.get("args", [])]
    env = {**env, "MODEL_DIR": str(model_dir), "PATH": os.environ["PATH"]}
    out = subprocess.run(["timeout", "2", *argv], env=env, capture_output=True, text=True)
    return out.returncode


@pytest.mark.parametrize("overlay", [SEVEN_B, "deploy/k8s/overlays/qwen2.5-32b-tp2"])
def test_the_pods_wait_for_the_marker_naming_their_model(
    rendered: dict[str, list[Doc]], overlay: str, tmp_path: Path
) -> None:
    waits = wait_commands(rendered[overlay])
    assert {w for w, _, _ in waits} == {"StatefulSet/vllm", "Deployment/loopstack"}
    for where, c, env in waits:
        marker = tmp_path / MARKER
        marker.unlink(missing_ok=True)
        assert run_wait(c, env, tmp_path) == 124, f"{where}: started without weights"
        marker.write_text("Qwen/Qwen2.5-0.5B-Instruct@main\n")  # another model's
        assert run_wait(c, env, tmp_path) == 124, f"{where}: started on another model"
        marker.write_text(f"{env['MODEL_REPO']}@{env['MODEL_REVISION']}\n")  # as fetch.py writes
        assert run_wait(c, env, tmp_path) == 0, f"{where}: does not see its marker"


def test_the_helm_engines_wait_for_their_models_marker(rendered: dict[str, list[Doc]]) -> None:
    values = yaml.safe_load((DEPLOY / "helm/values-vllm-stack.yaml").read_text())
    init = values["servingEngineSpec"]["modelSpec"][0]["initContainer"]
    weights = by_kind(rendered["deploy/helm/loopstack-layer"], "ConfigMap", "model-weights")["data"]
    script = " ".join(init["args"])
    assert f'"{weights["MODEL_REPO"]}@{weights["MODEL_REVISION"]}"' in script
    assert f"{weights['MODEL_DIR']}/{MARKER}" in script


# ------------------------------------------------------ the Job's script, run as its uid
@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder uid 10001 can read (pytest's tmp_path is root's only)."""
    root = Path(tempfile.mkdtemp(prefix="loopstack-weights-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


FAKE_HUB = """
import os, pathlib
def snapshot_download(repo, revision=None, local_dir=None, allow_patterns=None):
    d = pathlib.Path(local_dir)
    assert not (d / ".loopstack-complete").exists(), "marker still there during the download"
    with open(os.environ["FAKE_HUB_LOG"], "a") as log:
        log.write(f"{repo}@{revision}\\n")
    with open(os.environ["FAKE_HUB_LOG"] + ".patterns", "w") as log:
        log.write(" ".join(allow_patterns))
    (d / "config.json").write_text("{}")
"""


def run_fetch(
    docs: list[Doc], volume: Path, shared: Path, c: Doc | None = None
) -> subprocess.CompletedProcess[str]:
    """The Job's container command (or another fetching container's), as uid 10001, against
    a stand-in volume at MODEL_DIR."""
    if c is None:
        c = fetch_job(docs)["spec"]["template"]["spec"]["containers"][0]
    env = container_env(docs, c)
    assert c["command"][1:] == ["-c", "$(FETCH_SCRIPT)"]
    fake = shared / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "huggingface_hub.py").write_text(FAKE_HUB)
    log = shared / "downloads.log"
    for f in (log, log.with_name(log.name + ".patterns")):
        f.touch()
        f.chmod(0o666)
    model_dir = volume / env["MODEL_DIR"].removeprefix("/models/")
    env.update(MODEL_DIR=str(model_dir), PYTHONPATH=str(fake), FAKE_HUB_LOG=str(log),
               PATH=os.environ["PATH"])  # fmt: skip
    argv = [sys.executable, "-c", env["FETCH_SCRIPT"]]
    if os.geteuid() == 0:
        argv = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as uid 10001")


@needs_root
def test_the_job_fetches_once_per_model_and_marks_it(
    rendered: dict[str, list[Doc]], shared: Path
) -> None:
    docs = rendered[SEVEN_B]
    volume = shared / "volume"
    volume.mkdir()
    shutil.chown(volume, UID, UID)  # a volume the uid owns (fsGroup applied, or EFS uid 10001)
    out = run_fetch(docs, volume, shared)
    assert out.returncode == 0, out.stderr
    model_dir = volume / "Qwen/Qwen2.5-7B-Instruct"
    assert (model_dir / MARKER).read_text() == "Qwen/Qwen2.5-7B-Instruct@main\n"
    assert (shared / "downloads.log").read_text() == "Qwen/Qwen2.5-7B-Instruct@main\n"
    # the next Job of the same model (an image bump, a TTL'd Job made again) ends at once
    out = run_fetch(docs, volume, shared)
    assert out.returncode == 0 and "already complete" in out.stdout
    assert len((shared / "downloads.log").read_text().splitlines()) == 1
    # another revision into the same folder: the old marker goes first, a new one after
    weights = by_kind(docs, "ConfigMap", "model-weights")
    fetch_cm = by_kind(docs, "ConfigMap", "model-fetch")
    newer = [
        {**d, "data": {**d["data"], "MODEL_REVISION": "a1b2c3d"}} if d in (weights, fetch_cm) else d
        for d in docs
    ]
    out = run_fetch(newer, volume, shared)
    assert out.returncode == 0, out.stderr
    assert (model_dir / MARKER).read_text() == "Qwen/Qwen2.5-7B-Instruct@a1b2c3d\n"


@needs_root
def test_on_a_root_owned_export_the_job_stops_and_says_why(
    rendered: dict[str, list[Doc]], shared: Path
) -> None:
    """An NFS export owned by root, mode 755, where the kubelet applies no fsGroup: uid 10001
    cannot create the model's folder. The Job fails with the cause and the fix, not with a
    PermissionError deep in the download."""
    volume = shared / "volume"
    volume.mkdir(mode=0o755)  # root's, as the export is
    out = run_fetch(rendered[SEVEN_B], volume, shared)
    assert out.returncode != 0
    assert re.search(r"not writable by uid 10001 \(owner uid 0, gid 0, mode 755\)", out.stderr)
    assert "mountPermissions" in out.stderr and "docs/deploy.md" in out.stderr
    assert (shared / "downloads.log").read_text() == ""


# ------------------------------------------------------------------- 4. the storage class
def test_every_weights_claim_has_a_chosen_read_write_many_class(
    rendered: dict[str, list[Doc]],
) -> None:
    for path in WEIGHTED:
        claim = by_kind(rendered[path], "PersistentVolumeClaim", "model-weights")
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert claim["spec"].get("storageClassName"), f"{path}: the cluster default (RWO?)"


def test_rendering_without_a_storage_class_stops(tmp_path: Path) -> None:
    line = "  - ../../components/weights-storage/nfs"
    text = (ROOT / OVERLAY).read_text()
    assert line in text
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    (copy / "k8s/overlays/qwen2.5-7b/kustomization.yaml").write_text(
        "\n".join(x for x in text.splitlines() if not x.startswith(line)) + "\n"
    )
    out = subprocess.run(["kubectl", "kustomize", str(copy / "k8s/overlays/qwen2.5-7b")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode != 0 and "weights-storage" in out.stderr


@pytest.mark.parametrize(("component", "cls"), [("efs", "efs-sc"), ("filestore", "standard-rwx")])
def test_each_storage_component_sets_its_class(tmp_path: Path, component: str, cls: str) -> None:
    docs = render_edited(
        tmp_path, {OVERLAY: ("weights-storage/nfs", f"weights-storage/{component}")}
    )
    claim = by_kind(docs, "PersistentVolumeClaim", "model-weights")
    assert claim["spec"]["storageClassName"] == cls


# ------------------------------------- the per-engine copies (ReadWriteOnce classes only)
def init_container(docs: list[Doc], kind: str, name: str, init: str) -> Doc:
    spec = by_kind(docs, kind, name)["spec"]["template"]["spec"]
    found: Doc = next(c for c in spec["initContainers"] if c["name"] == init)
    return found


def test_per_engine_weights_need_no_shared_volume(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered[PER_ENGINE]
    kinds = {(d["kind"], d["metadata"]["name"].split("-")[0]) for d in docs}
    assert ("Job", "model") not in kinds and not [
        d for d in docs if d["kind"] == "PersistentVolumeClaim"
    ]
    sts = by_kind(docs, "StatefulSet", "vllm")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "weights"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in claim["spec"]  # the cluster's default (EBS, PD, Azure Disk)
    spec = sts["spec"]["template"]["spec"]
    assert "weights" not in {v["name"] for v in spec["volumes"]}
    engine = spec["containers"][0]
    assert {"name": "weights", "mountPath": "/models", "readOnly": True} in engine["volumeMounts"]
    env = container_env(docs, engine)
    assert env["HF_HUB_OFFLINE"] == "1" and env["MODEL"].startswith("/models/")
    layer = by_kind(docs, "Deployment", "loopstack")["spec"]["template"]["spec"]
    assert {"name": "weights", "emptyDir": {"sizeLimit": "1Gi"}} in layer["volumes"]
    fetch = init_container(docs, "Deployment", "loopstack", "fetch-tokenizer")
    assert container_env(docs, fetch)["FETCH_TOKENIZER_ONLY"] == "1"


@needs_root
def test_each_engine_fetches_its_copy_and_the_layer_its_tokenizer(
    rendered: dict[str, list[Doc]], shared: Path
) -> None:
    docs = rendered[PER_ENGINE]
    volume = shared / "volume"
    volume.mkdir()
    shutil.chown(volume, UID, UID)  # a block volume: the kubelet applies fsGroup
    engine = init_container(docs, "StatefulSet", "vllm", "fetch-weights")
    out = run_fetch(docs, volume, shared, engine)
    assert out.returncode == 0, out.stderr
    assert (volume / "Qwen/Qwen2.5-7B-Instruct" / MARKER).is_file()
    assert "*.safetensors" in (shared / "downloads.log.patterns").read_text()
    layer = init_container(docs, "Deployment", "loopstack", "fetch-tokenizer")
    (volume / "Qwen/Qwen2.5-7B-Instruct" / MARKER).unlink()
    out = run_fetch(docs, volume, shared, layer)
    assert out.returncode == 0, out.stderr
    assert "*.safetensors" not in (shared / "downloads.log.patterns").read_text()


def test_per_engine_pods_may_fetch_and_nothing_else_may(rendered: dict[str, list[Doc]]) -> None:
    from tests.unit.deploy.test_deploy_security import INTERNET, STRANGER, allowed, pods_of

    docs = rendered[PER_ENGINE]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    pods = pods_of(docs)
    for fetching in ("vllm", "loopstack"):
        assert allowed(policies, pods[fetching], INTERNET, 443), fetching
        assert not allowed(policies, pods[fetching], INTERNET, 80), fetching
    assert not allowed(policies, STRANGER, pods["vllm"], 8000)
