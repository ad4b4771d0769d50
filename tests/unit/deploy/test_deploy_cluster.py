"""What a real cluster would break (issue 35), checked on the rendered manifests: the memory's
app role apart from the database admin (1), no `replicas` on autoscaled objects (2), a drain
that keeps one engine serving (3), requests that fit the GPU nodes the engines are pinned to
(4), weights from a shared read-only volume with no internet on the serving pods (6), probes
that outwait the health check (9), our images in one place with a registry (10), and the
`cpu-offline` overlay: the bundled model on CPUs, no GPU, no egress. The NetworkPolicy
checks (7) are in test_deploy_security.py, the router's 500 (8) in test_deploy_readiness.py,
the image targets (5) in test_deploy_images.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.conftest import (
    DEPLOY,
    GPU_OVERLAYS,
    KUSTOMIZATIONS,
    OVERLAYS,
    ROOT,
    SHARED_WEIGHTS,
    Doc,
    by_kind,
    container_env,
    containers,
    expanded_command,
    kustomize,
    pod_specs,
)
from tests.unit.deploy.test_deploy_readiness import health_worst_case_s

OFFLINE = "deploy/k8s/overlays/cpu-offline"
SCALERS = ("ScaledObject", "HorizontalPodAutoscaler")


def docs_of(rendered: dict[str, list[Doc]], path: Path) -> list[Doc]:
    return rendered[str(path.relative_to(ROOT))]


def pod_spec(docs: list[Doc], kind: str, name: str) -> Doc:
    spec: Doc = by_kind(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def env_vars(c: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in c.get("env", [])}


# ------------------------------------------------------------- 1. the memory's two roles
def test_postgres_admin_and_app_roles_are_apart_on_kubernetes(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = rendered["deploy/k8s/agent-memory"]
    worker = pod_spec(docs, "Deployment", "agent-worker")["containers"][0]
    pg_spec = pod_spec(docs, "StatefulSet", "postgres")
    pg = pg_spec["containers"][0]
    wenv, penv = env_vars(worker), env_vars(pg)
    app_user = re.match(r"postgresql://(\w+)@", wenv["LOOPSTACK_MEMORY_URL"]["value"])
    assert app_user is not None
    # the image's superuser is not the role the workers log in as
    assert penv["POSTGRES_USER"]["value"] != app_user.group(1)
    assert penv["MEMORY_APP_USER"]["value"] == app_user.group(1)
    admin_secret = penv["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    app_secret = penv["MEMORY_APP_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert admin_secret["name"] != app_secret["name"]
    assert wenv["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == app_secret
    worker_secrets = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in containers(pod_spec(docs, "Deployment", "agent-worker"))
        for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
    }  # fmt: skip
    assert admin_secret["name"] not in worker_secrets
    # the init SQL (tested against a real server in tests/unit/memory/test_memory_pg_roles.py)
    # is what the image runs on its first start
    mount = next(m for m in pg["volumeMounts"] if m["mountPath"] == "/docker-entrypoint-initdb.d")
    volume = next(v for v in pg_spec["volumes"] if v["name"] == mount["name"])
    cm = by_kind(docs, "ConfigMap", volume["configMap"]["name"])
    sql = DEPLOY / "k8s/agent-memory/initdb/10-app-role.sql"
    assert cm["data"] == {sql.name: sql.read_text()}
    assert "NOSUPERUSER NOBYPASSRLS" in sql.read_text()


def test_postgres_admin_and_app_roles_are_apart_in_compose() -> None:
    compose_file = DEPLOY / "compose/compose.yaml"
    pg = yaml.safe_load(compose_file.read_text())["services"]["postgres"]
    env = pg["environment"]
    assert env["POSTGRES_USER"] != env["MEMORY_APP_USER"] == "loopstack"
    assert env["POSTGRES_PASSWORD"] != env["MEMORY_APP_PASSWORD"]
    secret_var = re.compile(r"\$\{(\w+)")
    admin_var = secret_var.match(env["POSTGRES_PASSWORD"])
    app_var = secret_var.match(env["MEMORY_APP_PASSWORD"])
    assert admin_var and app_var and admin_var.group(1) != app_var.group(1)
    src = next(v.split(":")[0] for v in pg["volumes"] if "/docker-entrypoint-initdb.d" in v)
    assert (compose_file.parent / src).resolve() == (DEPLOY / "k8s/agent-memory/initdb")
    assert "postgresql://loopstack@" in compose_file.read_text()  # what the agents use


# ------------------------------------------------------- 2. and 3. replicas and drains
def scaler_of(docs: list[Doc], workload: Doc) -> Doc | None:
    return next(
        (s for s in docs if s["kind"] in SCALERS
         and s["spec"]["scaleTargetRef"]["name"] == workload["metadata"]["name"]
         and s["spec"]["scaleTargetRef"]["kind"] == workload["kind"]),
        None,
    )  # fmt: skip


def test_no_autoscaled_object_sets_replicas(rendered: dict[str, list[Doc]]) -> None:
    """`kubectl apply` of a workload that sets `replicas` resets what the autoscaler chose."""
    failures, scaled = [], 0
    for name, docs in rendered.items():
        for where, w, _ in pod_specs(docs):
            if scaler_of(docs, w) is not None:
                scaled += 1
                if "replicas" in w["spec"]:
                    failures.append(f"{name}: {where} sets replicas under an autoscaler")
    assert scaled >= len(GPU_OVERLAYS) and not failures, failures
    # the Helm chart always writes replicaCount: it must be the autoscaler's minimum
    values = yaml.safe_load((DEPLOY / "helm/values-vllm-stack.yaml").read_text())
    scaler = yaml.safe_load((DEPLOY / "helm/scaledobject-vllm-stack.yaml").read_text())
    model = values["servingEngineSpec"]["modelSpec"][0]
    assert model["replicaCount"] == scaler["spec"]["minReplicaCount"]


def minimum_replicas(docs: list[Doc], w: Doc) -> int:
    scaler = scaler_of(docs, w)
    if scaler is None:
        return int(w["spec"].get("replicas", 1))
    spec = scaler["spec"]
    return int(spec.get("minReplicaCount", spec.get("minReplicas", 1)))


def always_available(pdb: Doc, replicas: int) -> int:
    """Pods a PDB keeps running through voluntary evictions, at `replicas` pods."""
    spec = pdb["spec"]
    if "minAvailable" in spec:
        return int(spec["minAvailable"])
    return replicas - int(spec.get("maxUnavailable", 0))


def drain_problems(docs: list[Doc]) -> list[str]:
    problems = []
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for where, w, _ in pod_specs(docs):
        if w["kind"] not in ("Deployment", "StatefulSet") or w["metadata"]["name"] == "postgres":
            continue
        if w["metadata"]["name"] == "agent-worker":  # replicas: 0 until you give it a command
            continue
        labels = w["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        low = minimum_replicas(docs, w)
        if not mine:
            problems.append(f"{where}: no PodDisruptionBudget")
            continue
        kept = always_available(mine[0], low)
        if kept < 1:
            problems.append(f"{where}: a drain may evict all {low} replica(s)")
        if low - kept < 1:
            problems.append(f"{where}: at {low} replica(s) a drain can never evict one")
    return problems


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_a_drain_keeps_one_replica_serving_and_can_proceed(
    rendered: dict[str, list[Doc]], kustomization: Path
) -> None:
    assert not drain_problems(docs_of(rendered, kustomization))


def test_the_drain_check_catches_the_old_budget(rendered: dict[str, list[Doc]]) -> None:
    """Before issue 35: PDB maxUnavailable 1 with an autoscaler minimum of 1."""
    docs = yaml.safe_load(yaml.safe_dump(rendered["deploy/k8s/overlays/qwen2.5-7b"]))
    by_kind(docs, "PodDisruptionBudget", "vllm")["spec"] = {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "vllm"}},
    }
    by_kind(docs, "ScaledObject", "vllm")["spec"]["minReplicaCount"] = 1  # fmt: skip
    assert any("may evict all 1" in p for p in drain_problems(docs))


def test_the_helm_engines_have_a_budget_and_two_replicas(rendered: dict[str, list[Doc]]) -> None:
    values = yaml.safe_load((DEPLOY / "helm/values-vllm-stack.yaml").read_text())
    scaler = yaml.safe_load((DEPLOY / "helm/scaledobject-vllm-stack.yaml").read_text())
    labels = values["servingEngineSpec"]["labels"]
    pdb = by_kind(rendered["deploy/helm/loopstack-layer"], "PodDisruptionBudget", "vllm-stack")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    low = scaler["spec"]["minReplicaCount"]
    assert always_available(pdb, low) >= 1 and low - always_available(pdb, low) >= 1


# ------------------------------------------------------ 4. requests that fit the GPU nodes
# GPU memory as GPU feature discovery labels it (nvidia.com/gpu.memory, MiB), and the
# smallest common cloud node per GPU kind and count, as what its pods may request (vCPU,
# GiB): allocatable (what the kubelet offers after system reservations: ~14.5 GiB of a 16 GiB
# node, ~27-30 of 32) less ~0.5 CPU / 1 GiB for the GPU operator's and the cloud's daemons.
GPU_MIB = {"L4": 23034, "A10G": 23028, "L40S": 46068, "A100-80GB": 81920, "H100-80GB": 81559,
           "H200": 143771}  # fmt: skip
NODES = {
    ("L4", 1): (3.4, 13.5), ("A10G", 1): (3.4, 13.5),  # g6.xlarge, g5.xlarge: 4 vCPU, 16 GiB
    ("L40S", 1): (3.4, 26),  # g6e.xlarge: 4 vCPU, 32 GiB
    ("L4", 2): (47, 170), ("A10G", 2): (47, 170), ("L40S", 2): (47, 340),  # 4-GPU .12xlarge
    ("A100-80GB", 1): (11.5, 150), ("A100-80GB", 2): (23.5, 300),  # a2-ultragpu-1g/-2g
    ("H100-80GB", 1): (25, 200), ("H100-80GB", 2): (51, 400),  # a3-highgpu-1g/-2g
    ("H200", 1): (180, 1800), ("H200", 2): (180, 1800),  # 8-GPU nodes only
}  # fmt: skip
WEIGHTS_GB = {"Qwen2.5-7B-Instruct": 15, "Qwen2.5-32B-Instruct": 65}


def quantity_gib(q: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 1024}
    m = re.fullmatch(r"([\d.]+)(\w*)", str(q))
    assert m, q
    return float(m.group(1)) * units.get(m.group(2), 2**-30)


def cpu_cores(q: str) -> float:
    return float(q[:-1]) / 1000 if str(q).endswith("m") else float(q)


def admitted_gpus(spec: Doc) -> list[str]:
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]  # fmt: skip
    assert len(terms) == 1
    exprs = {e["key"]: e for e in terms[0]["matchExpressions"]}
    assert exprs["nvidia.com/gpu.present"]["values"] == ["true"]
    floor = exprs["nvidia.com/gpu.memory"]
    assert floor["operator"] == "Gt"
    return [g for g, mib in GPU_MIB.items() if mib > int(floor["values"][0])]


@pytest.mark.parametrize("overlay", GPU_OVERLAYS, ids=lambda p: p.name)
def test_engines_fit_the_gpu_nodes_they_are_pinned_to(
    rendered: dict[str, list[Doc]], overlay: Path
) -> None:
    docs = docs_of(rendered, overlay)
    spec = pod_spec(docs, "StatefulSet", "vllm")
    c = spec["containers"][0]
    env = container_env(docs, c)
    res = c["resources"]
    gpus = int(res["limits"]["nvidia.com/gpu"])
    assert gpus == int(env["TENSOR_PARALLEL_SIZE"])
    weights = WEIGHTS_GB[Path(env["MODEL"]).name]
    admitted = admitted_gpus(spec)
    assert admitted
    for gpu in admitted:
        # the weights plus a KV cache of a fifth of them fit in what vLLM may use
        room = GPU_MIB[gpu] / 1024 * gpus * float(env["GPU_MEMORY_UTILIZATION"]) - weights
        assert room >= 0.2 * weights, (gpu, gpus, room)
        cpu, mem = NODES[(gpu, gpus)]
        assert cpu_cores(res["requests"]["cpu"]) <= cpu, (gpu, res)
        assert quantity_gib(res["requests"]["memory"]) <= mem, (gpu, res)
        assert quantity_gib(res["limits"]["memory"]) <= mem, (gpu, res)
    # the 24 GB cards the 7B runs on never get the tensor-parallel 32B
    if weights > 40:
        assert not {"L4", "A10G"} & set(admitted)
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"]
    assert quantity_gib(shm) < quantity_gib(res["limits"]["memory"]) / 2


# ------------------------------------------------------- 6. weights without the internet
MARKER = ".loopstack-complete"


@pytest.mark.parametrize("overlay", SHARED_WEIGHTS, ids=lambda p: p.name)
def test_weights_come_from_a_shared_read_only_volume_offline(
    rendered: dict[str, list[Doc]], overlay: Path
) -> None:
    docs = docs_of(rendered, overlay)
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    engine_spec = pod_spec(docs, "StatefulSet", "vllm")
    assert "volumeClaimTemplates" not in by_kind(docs, "StatefulSet", "vllm")["spec"]
    layer_spec = pod_spec(docs, "Deployment", "loopstack")
    job = by_kind(docs, "Job", "model-fetch")
    job_c = job["spec"]["template"]["spec"]["containers"][0]
    target = container_env(docs, job_c)["MODEL_DIR"]
    assert MARKER in expanded_command(docs, job_c)
    loaded = {}
    for name, spec, key in (
        ("vllm", engine_spec, "MODEL"),
        ("loopstack", layer_spec, "LOOPSTACK_MODEL"),
    ):
        c = next(c for c in spec["containers"] if c["name"] == name)
        env = container_env(docs, c)
        assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1", name
        loaded[name] = env[key]
        vols = {v["name"]: v for v in spec["volumes"]}
        mount = next(m for m in c["volumeMounts"] if env[key].startswith(m["mountPath"] + "/"))
        pvc = vols[mount["name"]]["persistentVolumeClaim"]
        assert mount.get("readOnly") is True and pvc.get("readOnly") is True, name
        assert claims[pvc["claimName"]]["spec"]["accessModes"] == ["ReadWriteMany"]
        waits = [i for i in spec.get("initContainers", []) if MARKER in " ".join(i["command"])]
        assert waits, f"{name} does not wait for the weights"
    assert loaded["vllm"] == loaded["loopstack"] == target


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_every_configmap_a_pod_reads_exists(
    rendered: dict[str, list[Doc]], kustomization: Path
) -> None:
    docs = docs_of(rendered, kustomization)
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    missing = []
    for where, _, spec in pod_specs(docs):
        for v in spec.get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in maps:
                missing.append(f"{where}: volume {v['configMap']['name']}")
        for c in containers(spec):
            try:
                container_env(docs, c)
            except KeyError as exc:
                missing.append(f"{where}/{c['name']}: {exc}")
    assert not missing, missing


# ----------------------------------------------------------------- 9. probes and health
OURS = re.compile(r"(^|/)loopstack:")


def test_probes_of_our_health_wait_longer_than_its_deadline(
    rendered: dict[str, list[Doc]],
) -> None:
    worst = health_worst_case_s()
    seen, failures = 0, []
    for name, docs in rendered.items():
        for where, _, spec in pod_specs(docs):
            for c in spec["containers"]:
                if not OURS.search(c["image"]):
                    continue
                for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    probe = c.get(kind, {})
                    if probe.get("httpGet", {}).get("path") == "/health":
                        seen += 1
                        if int(probe.get("timeoutSeconds", 1)) <= worst:
                            failures.append(f"{name}: {where} {kind}: {probe}")
    assert seen >= len(OVERLAYS) and not failures, failures


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_the_image_healthcheck_waits_longer_than_the_deadline(dockerfile: str) -> None:
    text = (DEPLOY / "docker" / dockerfile).read_text()
    outer = re.search(r"^HEALTHCHECK .*--timeout=(\d+)s", text, re.M)
    inner = re.search(r"/health.*timeout=(\d+)\)", text)
    assert outer and inner
    assert int(outer.group(1)) > int(inner.group(1)) > health_worst_case_s()


# ------------------------------------------------------------- 10. images with a registry
def test_our_images_take_a_registry_from_one_file(tmp_path: Path) -> None:
    """Pointing the images at a registry is one edit (no standalone kustomize needed)."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    images = copy / "k8s/components/images/kustomization.yaml"
    out = subprocess.run(
        ["sed", "-i", "s#newName: #newName: registry.example.com/team/#", str(images)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ours = dict.fromkeys(KUSTOMIZATIONS, 0)
    for k in KUSTOMIZATIONS:
        for where, _, spec in pod_specs(kustomize(copy / k.relative_to(DEPLOY))):
            for c in containers(spec):
                name = c["image"].rsplit("/", 1)[-1].split(":")[0]
                if name in ("loopstack", "loopstack-agent-worker"):
                    ours[k] += 1
                    assert c["image"].startswith("registry.example.com/team/"), (where, c)
    assert all(n >= 1 for n in ours.values()), ours


# --------------------------------------------------------------------------- cpu-offline
def test_cpu_offline_serves_the_bundled_model_with_no_gpu_and_no_egress(
    rendered: dict[str, list[Doc]],
) -> None:
    from loopstack.serving.config import OFFLINE_SMALL, ServerSettings

    docs = rendered[OFFLINE]
    text = yaml.safe_dump_all(docs)
    assert "nvidia.com/gpu" not in text and "vllm/vllm-openai" not in text
    assert not [d for d in docs if d["kind"] in ("PersistentVolumeClaim", "Job", *SCALERS)]
    engine_w = by_kind(docs, "StatefulSet", "vllm")
    engine_spec = engine_w["spec"]["template"]["spec"]
    assert not {"affinity", "tolerations", "initContainers"} & set(engine_spec)
    engine = engine_spec["containers"][0]
    assert OURS.search(engine["image"]) and engine["args"] == ["serve"]
    layer_c = next(c for c in pod_spec(docs, "Deployment", "loopstack")["containers"])
    e_env, l_env = container_env(docs, engine), container_env(docs, layer_c)
    for env in (e_env, l_env):
        assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
        assert env["LOOPSTACK_DEVICE"] == "cpu" and env["LOOPSTACK_MODEL"] == OFFLINE_SMALL
        ServerSettings(**{k[10:].lower(): v for k, v in env.items()  # the values parse
                          if k.startswith("LOOPSTACK_") and v != "<secret>"})  # fmt: skip
    for key in ("LOOPSTACK_SERVED_MODEL_NAME", "LOOPSTACK_MAX_MODEL_LEN"):
        assert e_env[key] == l_env[key], key
    # the router reaches the engines on the port they listen on, with the key they check
    router = pod_spec(docs, "Deployment", "vllm-router")["containers"][0]
    assert f"--k8s-port={e_env['LOOPSTACK_PORT']}" in router["args"]
    key = env_vars(engine)["LOOPSTACK_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key == env_vars(router)["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key == env_vars(layer_c)["LOOPSTACK_ENGINE_API_KEY"]["valueFrom"]["secretKeyRef"]
    # nothing may leave the cluster: no ipBlock and no HTTPS in any egress rule
    for p in (d for d in docs if d["kind"] == "NetworkPolicy"):
        for rule in p["spec"].get("egress", []) or []:
            assert not any("ipBlock" in peer for peer in rule.get("to", [])), p["metadata"]
            ports = {x.get("port") for x in rule.get("ports", [])}
            if p["metadata"]["name"] != "vllm-router":  # its peer-less rule: the API server
                assert 443 not in ports, p["metadata"]
    # a fixed pair of engines, and the whole thing fits a 4-CPU, 16 GiB CI runner
    assert engine_w["spec"]["replicas"] == 2
    cpu = mem = 0.0
    for _, w, spec in pod_specs(docs):
        for c in spec["containers"]:
            req: dict[str, Any] = c["resources"]["requests"]
            n = int(w["spec"].get("replicas", 1))
            cpu += n * (float(req["cpu"][:-1]) / 1000 if req["cpu"].endswith("m") else float(
                req["cpu"]))  # fmt: skip
            mem += n * quantity_gib(req["memory"])
    assert cpu <= 3.5 and mem <= 12, (cpu, mem)


# ---------------------------------------------------------------------------------- docs
DOC = ROOT / "docs/deploy.md"


def test_the_docs_name_the_images_the_dockerfiles_use() -> None:
    text = DOC.read_text()
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):
        base = re.search(r"^ARG BASE_IMAGE=(\S+)$", (DEPLOY / "docker" / dockerfile).read_text(),
                         re.M)  # fmt: skip
        assert base and f"`{base.group(1)}`" in text, dockerfile
    python = re.findall(r"python:\d+\.\d+\.\d+-slim-\w+", text)
    assert python and len(set(python)) == 1, set(python)
    assert "bookworm" not in text
    assert not re.search(r"Debian packages (are pinned )?by version", text)


def test_the_docs_need_no_standalone_kustomize() -> None:
    """kubectl has kustomize built in (`apply -k`, `kustomize`), but not `kustomize edit`."""
    text = DOC.read_text()
    assert not re.search(r"^\s*\(?(cd \S+ && )?kustomize ", text, re.M)
    assert "kustomize edit" not in text


def test_the_docs_walk_the_cpu_offline_overlay_first() -> None:
    text = DOC.read_text()
    applies = re.findall(r"kubectl apply -k (\S+)", text)
    assert applies and applies[0] == OFFLINE, applies[:3]
    assert "make images REGISTRY=" in text and "components/images" in text
