"""What a real cluster needs beyond a clean render (issue: "Deploy that survives a real
cluster"): storage that every replica can attach (defect 1), metrics that reach the
autoscaler and alerts an operator can act on (3), probes that agree with the code and no
dead settings or ports (5), and availability through node drains and rollouts (7)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.unit.deploy.conftest import (
    DEPLOY,
    MONITORED,
    OVERLAYS,
    ROOT,
    Doc,
    by_kind,
    containers,
    pod_specs,
)


def overlay_docs(rendered: dict[str, list[Doc]], overlay: Path) -> list[Doc]:
    return rendered[str(overlay.relative_to(ROOT))]


# ---------------------------------------------------------------- 1. per-replica storage
def max_replicas(workload: Doc, docs: list[Doc]) -> int:
    most = int(workload["spec"].get("replicas", 1))
    for s in docs:
        if s["kind"] in ("ScaledObject", "HorizontalPodAutoscaler"):
            ref = s["spec"]["scaleTargetRef"]
            if ref["name"] == workload["metadata"]["name"]:
                most = max(most, int(s["spec"].get("maxReplicaCount", s["spec"].get(
                    "maxReplicas", 100))))  # fmt: skip
    return most


def shared_rwo_claims(docs: list[Doc]) -> list[str]:
    """ReadWriteOnce claims that more than one pod mounts: the second node cannot attach."""
    claims = {
        d["metadata"]["name"]: d["spec"].get("accessModes", [])
        for d in docs
        if d["kind"] == "PersistentVolumeClaim"
    }
    bad = []
    for where, workload, spec in pod_specs(docs):
        for vol in spec.get("volumes", []):
            name = vol.get("persistentVolumeClaim", {}).get("claimName")
            if name is None:
                continue
            modes = claims.get(name, ["ReadWriteOnce"])  # unknown claim: assume the default
            if "ReadWriteMany" not in modes and max_replicas(workload, docs) > 1:
                bad.append(f"{where} mounts ReadWriteOnce claim {name} from several replicas")
    return bad


def helm_engine_docs(values: Doc, scaled: Doc, claims: list[Doc] = ()) -> list[Doc]:  # type: ignore[assignment]
    """The vllm-stack chart's engine Deployment and PVC as its templates make them (0.1.12:
    one PVC `<release>-<model>-storage-claim` per model when `pvcStorage` is set, mounted
    by every replica), plus our ScaledObject and the claims applied beside the chart
    (deploy/helm/loopstack-layer's model-weights), reduced to what the claim check reads."""
    docs: list[Doc] = [scaled, *claims]
    for model in values["servingEngineSpec"]["modelSpec"]:
        name = f"vllm-stack-{model['name']}-deployment-vllm"
        volumes: list[Doc] = list(model.get("extraVolumes", []))
        if "pvcStorage" in model:
            claim = f"vllm-stack-{model['name']}-storage-claim"
            volumes.append({"name": "storage", "persistentVolumeClaim": {"claimName": claim}})
            docs.append({
                "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
                "spec": {"accessModes": model.get("pvcAccessMode", ["ReadWriteOnce"])},
            })  # fmt: skip
        docs.append({
            "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": model.get("replicaCount", 1), "template": {"spec": {
                "containers": [{"name": "vllm"}], "volumes": volumes}}},
        })  # fmt: skip
    return docs


HELM_VALUES = DEPLOY / "helm" / "values-vllm-stack.yaml"
HELM_SCALER = DEPLOY / "helm" / "scaledobject-vllm-stack.yaml"
HELM_LAYER = "deploy/helm/loopstack-layer"


def helm_claims(rendered: dict[str, list[Doc]]) -> list[Doc]:
    return [d for d in rendered[HELM_LAYER] if d["kind"] == "PersistentVolumeClaim"]


def test_no_readwriteonce_claim_is_shared_by_replicas(rendered: dict[str, list[Doc]]) -> None:
    failures = [f"{n}: {b}" for n, docs in rendered.items() for b in shared_rwo_claims(docs)]
    values = yaml.safe_load(HELM_VALUES.read_text())
    scaled = yaml.safe_load(HELM_SCALER.read_text())
    helm = helm_engine_docs(values, scaled, helm_claims(rendered))
    failures += [f"helm: {b}" for b in shared_rwo_claims(helm)]
    assert not failures, "\n".join(failures)


def test_the_claim_check_catches_a_shared_claim(rendered: dict[str, list[Doc]]) -> None:
    values = yaml.safe_load(HELM_VALUES.read_text())
    scaled = yaml.safe_load(HELM_SCALER.read_text())
    claims = helm_claims(rendered)
    model = values["servingEngineSpec"]["modelSpec"][0]
    model.update(pvcStorage="60Gi", pvcAccessMode=["ReadWriteOnce"], replicaCount=2)
    assert shared_rwo_claims(helm_engine_docs(values, scaled, claims))
    model["pvcAccessMode"] = ["ReadWriteMany"]
    assert not shared_rwo_claims(helm_engine_docs(values, scaled, claims))
    assert shared_rwo_claims(helm_engine_docs(values, scaled))  # model-weights unknown: RWO


def test_helm_engines_load_the_shared_weights_read_only_and_offline(
    rendered: dict[str, list[Doc]],
) -> None:
    """Issue 35, defect 6: no engine of the chart downloads (each did, under its startup
    probe): they mount the claim deploy/helm/loopstack-layer makes and its Job fills."""
    model = yaml.safe_load(HELM_VALUES.read_text())["servingEngineSpec"]["modelSpec"][0]
    volumes = {v["name"]: v for v in model.get("extraVolumes", [])}
    mounts = {m["name"]: m for m in model.get("extraVolumeMounts", [])}
    claims = {c["metadata"]["name"]: c for c in helm_claims(rendered)}
    shared = [n for n, v in volumes.items() if "persistentVolumeClaim" in v]
    assert shared, volumes
    for n in shared:
        pvc = volumes[n]["persistentVolumeClaim"]
        assert pvc["readOnly"] is True and mounts[n]["readOnly"] is True
        assert claims[pvc["claimName"]]["spec"]["accessModes"] == ["ReadWriteMany"]
    job = next(d for d in rendered[HELM_LAYER] if d["kind"] == "Job")
    weights = next(d for d in rendered[HELM_LAYER] if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"] == "model-weights")["data"]  # fmt: skip
    assert model["modelURL"] == weights["MODEL_DIR"]
    assert any(weights["MODEL_DIR"].startswith(mounts[n]["mountPath"]) for n in shared)
    job_vols = job["spec"]["template"]["spec"]["volumes"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in job_vols
            if "persistentVolumeClaim" in v} == {volumes[n]["persistentVolumeClaim"]["claimName"]
                                                 for n in shared}  # fmt: skip
    env = {e["name"]: e.get("value") for e in model["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and "--download-dir" not in model["vllmConfig"].get(
        "extraArgs", [])  # fmt: skip
    init = model["initContainer"]
    assert ".loopstack-complete" in " ".join(init["command"] + init.get("args", []))


# ----------------------------------------------------------- 3. metrics, monitors, alerts
def metric_names_in(text: str) -> set[str]:
    return set(re.findall(r"\b(loopstack_[a-z_]+|vllm:[a-z0-9_]+)", text))


def monitors(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor")]


def test_every_overlay_is_monitored(rendered: dict[str, list[Doc]]) -> None:
    """cpu-offline included: each overlay renders the PodMonitors and the PrometheusRule the
    monitoring component ships (the checks below then run on each)."""
    assert MONITORED == OVERLAYS
    for overlay in OVERLAYS:
        kinds = {d["kind"] for d in overlay_docs(rendered, overlay)}
        assert {"PodMonitor", "PrometheusRule"} <= kinds, overlay.name


@pytest.mark.parametrize("overlay", MONITORED, ids=lambda p: p.name)
def test_prometheus_scrapes_vllm_the_router_and_the_layer(
    rendered: dict[str, list[Doc]], overlay: Path
) -> None:
    docs = overlay_docs(rendered, overlay)
    pods = {where.split("/")[1]: (w, spec) for where, w, spec in pod_specs(docs)}
    mons = monitors(docs)
    for name in ("vllm", "vllm-router", "loopstack"):
        workload, spec = pods[name]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        ports = {p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
        scraped = [
            m for m in mons
            if m["kind"] == "PodMonitor" and all(
                kv in labels.items() for kv in m["spec"]["selector"]["matchLabels"].items())
            and all(e.get("port") in ports for e in m["spec"]["podMetricsEndpoints"])
        ]  # fmt: skip
        assert scraped, f"nothing scrapes {name}"


@pytest.mark.parametrize("overlay", MONITORED, ids=lambda p: p.name)
def test_monitoring_objects_carry_the_release_label_from_one_value(
    rendered: dict[str, list[Doc]], overlay: Path
) -> None:
    docs = overlay_docs(rendered, overlay)
    objs = [*monitors(docs), *(d for d in docs if d["kind"] == "PrometheusRule")]
    assert objs
    releases = {d["metadata"].get("labels", {}).get("release") for d in objs}
    assert len(releases) == 1 and None not in releases, releases
    # the value is set in one place: the monitoring component's settings
    settings = DEPLOY / "k8s/components/monitoring/settings.env"
    assert f"RELEASE={releases.pop()}" in settings.read_text().splitlines()


def queries(docs: list[Doc]) -> dict[str, str]:
    """Every PromQL expression the autoscalers, alerts and dashboards of a render evaluate."""
    out: dict[str, str] = {}
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "ScaledObject":
            for i, t in enumerate(d["spec"]["triggers"]):
                out[f"{name}#{i}"] = t["metadata"]["query"]
        elif d["kind"] == "PrometheusRule":
            for g in d["spec"]["groups"]:
                for r in g["rules"]:
                    out[f"{name}/{r.get('alert') or r.get('record')}"] = r["expr"]
        elif d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard"):
            for file, text in d["data"].items():
                dash = json.loads(text)
                for p in dash["panels"]:
                    for t in p.get("targets", []):
                        out[f"{name}/{file}/{p['title']}"] = t["expr"]
    return out


def exported_metrics() -> set[str]:
    from tests.unit.deploy.test_deploy_manifests import our_metric_names, vllm_metric_names

    return our_metric_names() | vllm_metric_names()


def test_every_queried_metric_is_exported(rendered: dict[str, list[Doc]]) -> None:
    known = exported_metrics()
    used: dict[str, str] = {}
    for name, docs in rendered.items():
        used.update({f"{name}: {k}": v for k, v in queries(docs).items()})
    adapter = yaml.safe_load((DEPLOY / "k8s/components/hpa/prometheus-adapter-values.yaml")
                             .read_text())  # fmt: skip
    for rule in adapter["rules"]["custom"]:
        used[f"prometheus-adapter: {rule['name']['as']}"] = rule["seriesQuery"]
    helm_trigger = yaml.safe_load(HELM_SCALER.read_text())["spec"]["triggers"][0]
    used["helm: ScaledObject/vllm-stack"] = helm_trigger["metadata"]["query"]
    kinds = {k.split(": ", 1)[1].split("/")[0] for k in used}
    assert {"ScaledObject", "PrometheusRule", "ConfigMap"} <= kinds, kinds
    unknown = {k: sorted(metric_names_in(q) - known) for k, q in used.items()}
    assert not {k: v for k, v in unknown.items() if v}


def test_the_scalers_count_only_the_engines_queue(rendered: dict[str, list[Doc]]) -> None:
    """The router exports a gauge of the same name (vllm:num_requests_waiting, per backend):
    a query over every pod would count each waiting request twice."""
    exprs = [
        q for docs in rendered.values() for k, q in queries(docs).items()
        if k.startswith("ScaledObject")
    ]  # fmt: skip
    adapter = yaml.safe_load((DEPLOY / "k8s/components/hpa/prometheus-adapter-values.yaml")
                             .read_text())  # fmt: skip
    exprs += [r["seriesQuery"] for r in adapter["rules"]["custom"]]
    assert exprs
    for q in exprs:
        assert 'container="vllm"' in q, q


SLO_ALERTS = ("EngineDown", "QueueGrowing", "HighErrorRate", "StepLatencyAboveSLO")


@pytest.mark.parametrize("overlay", MONITORED, ids=lambda p: p.name)
def test_prometheus_rule_has_the_alerts_an_operator_needs(
    rendered: dict[str, list[Doc]], overlay: Path
) -> None:
    from loopstack.bench import cli as bench_cli

    rules = {
        r["alert"]: r
        for d in overlay_docs(rendered, overlay) if d["kind"] == "PrometheusRule"
        for g in d["spec"]["groups"] for r in g["rules"] if "alert" in r
    }  # fmt: skip
    assert {f"Loopstack{a}" for a in SLO_ALERTS} <= set(rules), set(rules)
    slo = inspect.signature(bench_cli.agents).parameters["slo_p95_step_s"].default.default
    latency = rules["LoopstackStepLatencyAboveSLO"]["expr"]
    assert "histogram_quantile(0.95" in latency and re.search(rf"> *{slo:g}\b", latency)
    for r in rules.values():
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"]


def test_the_dashboard_ships_as_a_configmap_of_the_file_compose_mounts(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = overlay_docs(rendered, MONITORED[0])
    cms = [d for d in docs if d["kind"] == "ConfigMap"
           and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]  # fmt: skip
    assert len(cms) == 1
    (text,) = cms[0]["data"].values()
    mounts = yaml.safe_load((DEPLOY / "compose/compose.yaml").read_text())["services"]["grafana"]
    src = next(v.split(":")[0] for v in mounts["volumes"] if "/var/lib/grafana/dashboards" in v)
    compose = DEPLOY / "compose" / src / "loopstack.json"
    assert json.loads(text) == json.loads(compose.read_text())


# ------------------------------------------------------- 5. probes, settings and ports
def layer_container(docs: list[Doc]) -> Doc:
    spec = by_kind(docs, "Deployment", "loopstack")["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "loopstack")


def configmap_env(docs: list[Doc], c: Doc) -> dict[str, str]:
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        name = src.get("configMapRef", {}).get("name")
        if name:
            env.update(next(d for d in docs if d["kind"] == "ConfigMap"
                            and d["metadata"]["name"] == name)["data"])  # fmt: skip
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return env


def window_s(probe: Doc) -> int:
    return int(probe.get("periodSeconds", 10)) * int(probe.get("failureThreshold", 3)) + int(
        probe.get("initialDelaySeconds", 0)
    )


@pytest.mark.parametrize("kustomization", [*OVERLAYS, DEPLOY / "helm/loopstack-layer"],
                         ids=lambda p: p.name)  # fmt: skip
def test_the_layers_startup_probe_outlasts_its_engine_wait(
    rendered: dict[str, list[Doc]], kustomization: Path
) -> None:
    """The layer listens only after its engine answers (up to
    LOOPSTACK_ENGINE_START_TIMEOUT_S): a shorter startup probe kills it mid-wait."""
    from loopstack.serving.config import ServerSettings

    docs = overlay_docs(rendered, kustomization)
    c = layer_container(docs)
    env = configmap_env(docs, c)
    default = ServerSettings.model_fields["engine_start_timeout_s"].default
    wait = float(env.get("LOOPSTACK_ENGINE_START_TIMEOUT_S", default))
    assert window_s(c["startupProbe"]) >= wait + 30, (c["startupProbe"], wait)


def settings_names() -> set[str]:
    """Every LOOPSTACK_* variable some code reads: the fields of each settings class, and
    the names the code spells out (os.environ lookups)."""
    from loopstack.agent.core.settings import AgentSettings
    from loopstack.memory.config import MemorySettings
    from loopstack.serving.config import ServerSettings

    names = {
        f"{cls.model_config.get('env_prefix', '')}{f}".upper()
        for cls in (ServerSettings, MemorySettings, AgentSettings)
        for f in cls.model_fields
    }
    for pkg in ("loopstack", "serving", "memory", "agent", "bench"):
        for py in (ROOT / pkg).rglob("*.py"):
            names |= set(re.findall(r"\"(LOOPSTACK_[A-Z_]+)\"", py.read_text()))
    return names


def test_every_loopstack_variable_set_is_read_by_some_code(
    rendered: dict[str, list[Doc]],
) -> None:
    read = settings_names()
    failures = []
    for name, docs in rendered.items():
        for where, _, spec in pod_specs(docs):
            for c in containers(spec):
                for var in configmap_env(docs, c) | {e["name"]: "" for e in c.get("env", [])}:
                    if var.startswith("LOOPSTACK_") and var not in read:
                        failures.append(f"{name}: {where}: {var}")
    assert not failures, "\n".join(failures)


OUR_IMAGES = re.compile(r"(^|/)loopstack(-agent-worker)?(:|$)")


def test_every_declared_port_of_our_containers_has_a_listener(
    rendered: dict[str, list[Doc]],
) -> None:
    """Our images listen on LOOPSTACK_PORT (serve) and nothing else; a worker serves none."""
    failures = []
    for name, docs in rendered.items():
        for where, _, spec in pod_specs(docs):
            for c in spec["containers"]:
                if not OUR_IMAGES.search(c["image"]):
                    continue
                env = configmap_env(docs, c)
                serves = c.get("args", ["serve"])[:1] == ["serve"]
                listening = {int(env.get("LOOPSTACK_PORT", 8000))} if serves else set()
                for p in c.get("ports", []):
                    if p["containerPort"] not in listening:
                        failures.append(f"{name}: {where}: port {p['containerPort']}")
    assert not failures, "\n".join(failures)


def test_every_long_running_container_has_probes(rendered: dict[str, list[Doc]]) -> None:
    failures = [
        f"{name}: {where}/{c['name']}"
        for name, docs in rendered.items()
        for where, w, spec in pod_specs(docs) if w["kind"] in ("Deployment", "StatefulSet")
        for c in spec["containers"]
        if not {"readinessProbe", "livenessProbe"} <= set(c)
    ]  # fmt: skip
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------ 7. availability
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_replicated_workload_has_a_pdb_and_spreads_over_nodes(
    rendered: dict[str, list[Doc]], overlay: Path
) -> None:
    docs = overlay_docs(rendered, overlay)
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for where, w, spec in pod_specs(docs):
        if max_replicas(w, docs) < 2:
            continue
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert any(p["spec"]["selector"]["matchLabels"].items() <= labels.items() for p in pdbs), (
            f"{where}: no PodDisruptionBudget"
        )
        spread = spec.get("topologySpreadConstraints", [])
        assert any(
            s["topologyKey"] == "kubernetes.io/hostname"
            and s["labelSelector"]["matchLabels"].items() <= labels.items()
            for s in spread
        ), f"{where}: no spread over nodes"


@pytest.mark.parametrize("kustomization", [*OVERLAYS, DEPLOY / "helm/loopstack-layer"],
                         ids=lambda p: p.name)  # fmt: skip
def test_a_rollout_lets_the_longest_agent_step_finish(
    rendered: dict[str, list[Doc]], kustomization: Path
) -> None:
    """On SIGTERM the layer drains: preStop waits until the endpoints have dropped the pod,
    then uvicorn finishes what is in flight; the grace period covers the longest step an
    agent waits for (its request timeout)."""
    from loopstack.agent.core.settings import AgentSettings

    docs = overlay_docs(rendered, kustomization)
    spec = by_kind(docs, "Deployment", "loopstack")["spec"]["template"]["spec"]
    c = layer_container(docs)
    pre = c["lifecycle"]["preStop"]
    pre_s = int(pre["sleep"]["seconds"]) if "sleep" in pre else 0
    assert pre_s >= 5
    step_s = AgentSettings.model_fields["request_timeout_s"].default
    # uvicorn's drain is bounded by LOOPSTACK_SHUTDOWN_GRACE_S; the kubelet's by the period
    drain_s = float(configmap_env(docs, c).get("LOOPSTACK_SHUTDOWN_GRACE_S", 10))
    assert drain_s >= step_s
    assert int(spec["terminationGracePeriodSeconds"]) >= pre_s + drain_s


def test_images_pin_no_debian_package_versions() -> None:
    """`apt-get install pkg=1.2-3` breaks when the next Debian point release drops that
    version; the base image tag pins the distribution instead."""
    for dockerfile in (DEPLOY / "docker").glob("Dockerfile.*"):
        for line in re.findall(r"apt-get install[^&]*", dockerfile.read_text()):
            assert not re.search(r"\S=\d", line), f"{dockerfile.name}: {line}"
