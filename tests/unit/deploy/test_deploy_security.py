"""No open doors: every pod passes Pod Security "restricted", the API keys fail closed, the
NetworkPolicies let only the layer reach the router and only the router reach vLLM, and the
compose file publishes on 127.0.0.1 unless told otherwise. Static checks of the rendered
manifests (issue: "Deploy that survives a real cluster", defect 6)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.conftest import (
    DEPLOY,
    MONITORED,
    OVERLAYS,
    ROOT,
    Doc,
    containers,
    pod_specs,
)

# ------------------------------------------------------------- Pod Security "restricted"
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (restricted profile)
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def restricted_violations(spec: Doc) -> list[str]:
    """What the "restricted" Pod Security Standard rejects in one pod spec."""
    bad: list[str] = []
    pod_sc = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(key)
    for vol in spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {vol['name']}: {sorted(kinds)}")
    pod_seccomp = pod_sc.get("seccompProfile", {}).get("type")
    for c in containers(spec):
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            bad.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"{name}: procMount")
    return bad


def test_every_pod_spec_passes_pod_security_restricted(rendered: dict[str, list[Doc]]) -> None:
    failures = [
        f"{name}: {where}: {v}"
        for name, docs in rendered.items()
        for where, _, spec in pod_specs(docs)
        for v in restricted_violations(spec)
    ]
    assert not failures, "\n".join(failures)


def test_the_restricted_check_rejects_what_the_standard_rejects() -> None:
    ok: Doc = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {"name": "c", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
        ],
        "volumes": [{"name": "d", "emptyDir": {}}],
    }  # fmt: skip
    assert restricted_violations(ok) == []
    for breaks in (
        lambda s: s["securityContext"].pop("seccompProfile"),
        lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        lambda s: s["containers"][0]["securityContext"].update(runAsUser=0),
        lambda s: s.update(hostNetwork=True),
    ):
        spec = yaml.safe_load(yaml.safe_dump(ok))
        breaks(spec)
        assert restricted_violations(spec), spec


def test_the_namespace_enforces_restricted(rendered: dict[str, list[Doc]]) -> None:
    for overlay in OVERLAYS:
        ns = next(d for d in rendered[str(overlay.relative_to(ROOT))] if d["kind"] == "Namespace")
        labels = ns["metadata"].get("labels", {})
        assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", labels


# The only containers allowed a writable root filesystem, with the reason. Empty: every
# container writes to its volumes only (HOME, caches and /tmp point at them).
WRITABLE_ROOT: dict[str, str] = {}


def test_root_filesystems_are_read_only(rendered: dict[str, list[Doc]]) -> None:
    failures = []
    for name, docs in rendered.items():
        for where, _, spec in pod_specs(docs):
            for c in containers(spec):
                if c["name"] in WRITABLE_ROOT:
                    continue
                if c.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
                    failures.append(f"{name}: {where}/{c['name']}")
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- secrets
def secret_refs(spec: Doc) -> list[tuple[str, Doc]]:
    return [
        (e["name"], e["valueFrom"]["secretKeyRef"])
        for c in containers(spec)
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    ]


def test_api_keys_are_required_secrets(rendered: dict[str, list[Doc]]) -> None:
    """A missing key Secret must stop the pod (CreateContainerConfigError), not run it open."""
    seen = set()
    for name, docs in rendered.items():
        for where, _, spec in pod_specs(docs):
            for env, ref in secret_refs(spec):
                if env.endswith("API_KEY"):
                    seen.add(env)
                    assert not ref.get("optional", False), f"{name}: {where}: {env} is optional"
    assert {"LOOPSTACK_API_KEY", "LOOPSTACK_ENGINE_API_KEY", "VLLM_API_KEY"} <= seen, seen


def env_of(spec: Doc) -> dict[str, Doc]:
    return {e["name"]: e for c in spec["containers"] for e in c.get("env", [])}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_vllm_and_the_router_take_the_key_the_layer_sends(
    rendered: dict[str, list[Doc]], overlay: Any
) -> None:
    docs = rendered[str(overlay.relative_to(ROOT))]
    specs = {where.split("/")[1]: spec for where, _, spec in pod_specs(docs)}
    engine_env = env_of(specs["vllm"])  # vLLM's key, or (cpu-offline) `loopstack serve`'s
    engine_key = (engine_env.get("VLLM_API_KEY") or engine_env["LOOPSTACK_API_KEY"])[
        "valueFrom"]["secretKeyRef"]  # fmt: skip
    router_key = env_of(specs["vllm-router"])["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    layer_key = env_of(specs["loopstack"])["LOOPSTACK_ENGINE_API_KEY"]["valueFrom"]
    assert engine_key == router_key == layer_key["secretKeyRef"]
    client_key = env_of(specs["loopstack"])["LOOPSTACK_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert client_key["name"] != engine_key["name"]  # clients never hold the engine's key


# ----------------------------------------------------------------------- NetworkPolicies
POD_NET = ipaddress.ip_network("10.244.0.0/16")  # a typical pod CIDR, for ipBlock rules


class Pod:
    """An endpoint. ``host``: on the node's network (the API server, NodeLocal DNSCache):
    no podSelector matches it, and Cilium matches no ipBlock to it either (it sees the
    host/kube-apiserver entity, not a CIDR); only a rule without peers lets traffic reach it."""

    def __init__(
        self, labels: dict[str, str], ns: str = "loopstack", ports: Any = (), host: bool = False
    ) -> None:
        self.labels, self.ns, self.host = labels, ns, host
        self.ports: dict[str, int] = dict(ports)
        self.ip = ipaddress.ip_address("10.244.1.7")


def selects(selector: Doc | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    want = selector.get("matchLabels", {})
    for expr in selector.get("matchExpressions", []):
        value = labels.get(expr["key"])
        if expr["operator"] == "In" and value not in expr["values"]:
            return False
        if expr["operator"] == "NotIn" and value in expr["values"]:
            return False
        if expr["operator"] == "Exists" and value is None:
            return False
    return want.items() <= labels.items()


def peer_matches(peer: Doc, pod: Pod, policy_ns: str) -> bool:
    if pod.host:  # Cilium: an ipBlock does not select node addresses; no selector does
        return False
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        inside = pod.ip in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            pod.ip in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    ns_labels = {"kubernetes.io/metadata.name": pod.ns}
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], ns_labels):
            return False
    elif pod.ns != policy_ns:
        return False
    return selects(peer.get("podSelector"), pod.labels)


def port_matches(rule: Doc, port: int, proto: str, target: Pod) -> bool:
    if not rule.get("ports"):
        return True
    for p in rule["ports"]:
        if p.get("protocol", "TCP") != proto:
            continue
        want = p.get("port")
        if want is None or want == port or target.ports.get(str(want)) == port:
            return True
    return False


def allowed(policies: list[Doc], src: Pod, dst: Pod, port: int, proto: str = "TCP") -> bool:
    """Kubernetes' semantics: a direction is open unless some policy selects the pod for it;
    then one of those policies' rules must let the connection through (both ends)."""

    def side(pod: Pod, kind: str, other: Pod, key: str) -> bool:
        mine = [
            p for p in policies
            if p["metadata"].get("namespace", "loopstack") == pod.ns
            and kind in p["spec"].get("policyTypes", ["Ingress"])
            and selects(p["spec"]["podSelector"], pod.labels)
        ]  # fmt: skip
        if not mine:
            return True
        target = dst
        for p in mine:
            for rule in p["spec"].get(kind.lower(), []) or []:
                peers = rule.get(key)
                if (not peers or any(peer_matches(x, other, pod.ns) for x in peers)) and (
                    port_matches(rule, port, proto, target)
                ):
                    return True
        return False

    return side(dst, "Ingress", src, "from") and side(src, "Egress", dst, "to")


def pods_of(docs: list[Doc]) -> dict[str, Pod]:
    out = {}
    for where, workload, spec in pod_specs(docs):
        ports = {
            p["name"]: p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])
            if "name" in p
        }  # fmt: skip
        labels = workload["spec"]["template"]["metadata"]["labels"]
        # a Job's name carries its content hash (model-fetch-<hash>): its pods' name label
        name = (
            labels["app.kubernetes.io/name"] if workload["kind"] == "Job" else where.split("/")[1]
        )
        out[name] = Pod(labels, ports=ports.items())
    return out


STRANGER = Pod({"app": "something-else"})
OTHER_NS = Pod({"app": "something-else"}, ns="team-b")
PROMETHEUS = Pod({"app.kubernetes.io/name": "prometheus"}, ns="monitoring")
KUBE_DNS = Pod({"k8s-app": "kube-dns"}, ns="kube-system")
INTERNET = Pod({}, ns="-")
INTERNET.ip = ipaddress.ip_address("18.0.0.1")
API_SERVER = Pod({}, ns="-", host=True)  # the control plane's node address, :443 or :6443
API_SERVER.ip = ipaddress.ip_address("10.0.0.10")
NODELOCAL_DNS = Pod({}, ns="-", host=True)  # NodeLocal DNSCache's link-local listener
NODELOCAL_DNS.ip = ipaddress.ip_address("169.254.20.10")


@pytest.fixture(scope="module")
def cluster(rendered: dict[str, list[Doc]]) -> tuple[list[Doc], dict[str, Pod]]:
    """The 7B overlay and the agent-memory kustomization applied together."""
    docs = rendered["deploy/k8s/overlays/qwen2.5-7b"] + rendered["deploy/k8s/agent-memory"]
    return [d for d in docs if d["kind"] == "NetworkPolicy"], pods_of(docs)


def test_each_namespace_denies_by_default(rendered: dict[str, list[Doc]]) -> None:
    for name, docs in rendered.items():
        if "helm" in name:
            continue
        deny = [
            d for d in docs if d["kind"] == "NetworkPolicy"
            and d["spec"]["podSelector"] == {}
            and set(d["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
            and not d["spec"].get("ingress") and not d["spec"].get("egress")
        ]  # fmt: skip
        assert deny, f"{name}: no default-deny NetworkPolicy"


@pytest.mark.parametrize(
    ("src", "dst", "port", "expected"),
    [
        ("loopstack", "vllm-router", 8000, True),
        ("vllm-router", "vllm", 8000, True),
        ("STRANGER", "vllm-router", 8000, False),
        ("STRANGER", "vllm", 8000, False),
        ("OTHER_NS", "vllm", 8000, False),
        ("loopstack", "vllm", 8000, False),  # only through the router
        ("agent-worker", "vllm-router", 8000, False),
        ("agent-worker", "vllm", 8000, False),
        ("agent-worker", "loopstack", 8000, True),
        ("agent-worker", "postgres", 5432, True),
        ("STRANGER", "postgres", 5432, False),
        ("loopstack", "postgres", 5432, False),
        ("OTHER_NS", "loopstack", 8000, True),  # the API itself: guarded by LOOPSTACK_API_KEY
        ("PROMETHEUS", "vllm", 8000, True),
        ("PROMETHEUS", "vllm-router", 8000, True),
        ("PROMETHEUS", "loopstack", 8000, True),
        ("vllm", "STRANGER", 5432, False),  # egress: nothing inside the cluster
        ("loopstack", "STRANGER", 80, False),
        ("vllm-router", "STRANGER", 8000, False),
        ("postgres", "STRANGER", 5432, False),
        ("vllm", "INTERNET", 443, False),  # issue 35: the weights are on a volume
        ("loopstack", "INTERNET", 443, False),  # ... and so is the tokenizer
        ("vllm-router", "INTERNET", 80, False),
        ("model-fetch", "INTERNET", 443, True),  # the one Job that fetches them
        ("model-fetch", "STRANGER", 8000, False),
        ("STRANGER", "model-fetch", 8000, False),
        ("vllm-router", "API_SERVER", 6443, True),  # pod discovery, Cilium included
        ("vllm-router", "API_SERVER", 443, True),
        ("loopstack", "API_SERVER", 6443, False),
        ("vllm", "API_SERVER", 443, False),
        ("postgres", "INTERNET", 443, False),
        ("agent-worker", "INTERNET", 25, False),
    ],
)
def test_network_policies_open_only_the_needed_paths(
    cluster: tuple[list[Doc], dict[str, Pod]], src: str, dst: str, port: int, expected: bool
) -> None:
    policies, pods = cluster
    named = {"STRANGER": STRANGER, "OTHER_NS": OTHER_NS, "PROMETHEUS": PROMETHEUS,
             "INTERNET": INTERNET, "API_SERVER": API_SERVER, **pods}  # fmt: skip
    assert allowed(policies, named[src], named[dst], port) is expected


@pytest.mark.parametrize("overlay", MONITORED, ids=lambda p: p.name)
def test_prometheus_may_scrape_what_each_overlay_monitors(
    rendered: dict[str, list[Doc]], overlay: Path
) -> None:
    """The PodMonitors are of use only if the NetworkPolicies let Prometheus in (cpu-offline,
    whose policies differ from the base's, included)."""
    docs = rendered[str(overlay.relative_to(ROOT))]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    pods = pods_of(docs)
    for name in ("vllm", "vllm-router", "loopstack"):
        assert allowed(policies, PROMETHEUS, pods[name], 8000), name


@pytest.mark.parametrize(
    "pod", ["loopstack", "vllm-router", "vllm", "agent-worker", "postgres", "model-fetch"]
)
@pytest.mark.parametrize("dns", [KUBE_DNS, NODELOCAL_DNS], ids=["kube-dns", "nodelocal-dns"])
def test_every_pod_resolves_names(
    cluster: tuple[list[Doc], dict[str, Pod]], pod: str, dns: Pod
) -> None:
    """Issue 35, defect 7: with NodeLocal DNSCache the answer comes from the node, which a
    kube-dns podSelector does not match."""
    policies, pods = cluster
    assert allowed(policies, pods[pod], dns, 53, "UDP")
    assert allowed(policies, pods[pod], dns, 53, "TCP")
    assert not allowed(policies, pods[pod], dns, 80)


def test_the_policy_model_sees_what_cilium_does_not_match() -> None:
    """The pre-issue-35 rules, checked by the same model: the router's `0.0.0.0/0` ipBlock
    does not reach the API server's node address, a kube-dns podSelector not NodeLocal DNS."""
    router = Pod({"app": "router"})
    old = [{"metadata": {}, "spec": {
        "podSelector": {}, "policyTypes": ["Egress"], "egress": [
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 6443}]},
            {"to": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
             "ports": [{"protocol": "UDP", "port": 53}]},
        ]}}]  # fmt: skip
    assert not allowed(old, router, API_SERVER, 6443)
    assert allowed(old, router, KUBE_DNS, 53, "UDP")
    assert not allowed(old, router, NODELOCAL_DNS, 53, "UDP")


def test_the_policy_model_follows_kubernetes_semantics() -> None:
    a, b = Pod({"app": "a"}), Pod({"app": "b"})
    deny = {"metadata": {}, "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}
    assert allowed([], a, b, 80)  # no policy: open
    assert not allowed([deny], a, b, 80)
    allow_b = {
        "metadata": {},
        "spec": {
            "podSelector": {"matchLabels": {"app": "b"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": 80}]}
            ],
        },
    }
    allow_a = {
        "metadata": {},
        "spec": {
            "podSelector": {"matchLabels": {"app": "a"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"podSelector": {}}]}],
        },
    }
    assert not allowed([deny, allow_b], a, b, 80)  # a's egress still denied
    assert allowed([deny, allow_b, allow_a], a, b, 80)
    assert not allowed([deny, allow_b, allow_a], a, b, 81)
    assert not allowed([deny, allow_b, allow_a], Pod({"app": "a"}, ns="x"), b, 80)


# ------------------------------------------------------------------------------ compose
COMPOSE = DEPLOY / "compose" / "compose.yaml"
LOCAL_DEFAULT = re.compile(r"^(127\.0\.0\.1|\$\{[A-Z_]+:-127\.0\.0\.1\}):")


def test_compose_publishes_on_localhost_unless_told_otherwise() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    published = [(name, p) for name, s in services.items() for p in s.get("ports", [])]
    assert published
    for name, port in published:
        assert LOCAL_DEFAULT.match(str(port)), f"{name}: {port} listens on every interface"
