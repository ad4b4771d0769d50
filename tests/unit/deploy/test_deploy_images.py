"""Images that exist (issue: "Deploy that survives a real cluster", defect 2 and the base
image of 7): `make images` builds every image of ours that a manifest references, tagged from
the project version; everything else is an upstream image at a pinned tag; the Kustomize
`images:` entries really map; each Dockerfile's COPY sources are in its build context.
No docker daemon runs here: `make -n` shows what the target would do."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.unit.deploy.conftest import DEPLOY, ROOT, Doc, containers, pod_specs

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OURS = ("loopstack", "loopstack-agent-worker")


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env=env,
    )  # fmt: skip


@functools.cache
def planned_builds(
    *args: str, targets: tuple[str, ...] = ("images", "image-gpu")
) -> dict[str, str]:
    """tag -> Dockerfile, from the commands `make -n TARGETS` would run (all our images)."""
    out = make("-n", *targets, *args)
    assert out.returncode == 0, out.stderr
    builds = {}
    for line in out.stdout.splitlines():
        if " build " in f" {line} ":
            tag = re.search(r"(?:-t|--tag)[ =](\S+)", line)
            dockerfile = re.search(r"(?:-f|--file)[ =](\S+)", line)
            assert tag and dockerfile, line
            builds[tag.group(1)] = dockerfile.group(1)
    return builds


def test_make_images_builds_each_image_tagged_from_the_project_version() -> None:
    """Issue 35, defect 5: `make images` builds what the cluster runs (the CPU image first,
    the worker on it), not the GPU image no manifest uses; `make image-gpu` builds that."""
    assert planned_builds(targets=("images",)) == {
        f"loopstack:{VERSION}-cpu": "deploy/docker/Dockerfile.cpu",
        f"loopstack-agent-worker:{VERSION}": "deploy/docker/Dockerfile.worker",
    }
    assert planned_builds(targets=("image-cpu",)) == {
        f"loopstack:{VERSION}-cpu": "deploy/docker/Dockerfile.cpu"
    }
    assert planned_builds(targets=("image-gpu",)) == {
        f"loopstack:{VERSION}-gpu": "deploy/docker/Dockerfile.gpu"
    }
    for dockerfile in planned_builds().values():
        assert (ROOT / dockerfile).is_file()


def test_make_images_pushes_to_the_registry_it_is_given() -> None:
    out = make("-n", "images", "image-gpu", "REGISTRY=registry.example.com/team")
    assert out.returncode == 0, out.stderr
    pushed = set(re.findall(r"\bpush (\S+)", out.stdout))
    assert pushed == {f"registry.example.com/team/{t}" for t in planned_builds()}
    assert "push" not in make("-n", "images").stdout  # no REGISTRY: build only


def build_line(target: str, *args: str) -> str:
    out = make("-n", target, *args)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if " build " in ln]
    return line


@pytest.mark.parametrize("target", ["image-cpu", "image-gpu"])
def test_the_build_inputs_are_make_variables(target: str, tmp_path: Path) -> None:
    """Base image, package indexes and a CA bundle reach `docker build` (`make -n`: no
    daemon here, so the plumbing is what is checked, not a build)."""
    ca = tmp_path / "corp-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    plain = build_line(target)
    assert "--build-arg" not in plain and "--secret" not in plain  # the Dockerfile defaults
    line = build_line(
        target, "BASE_IMAGE=mirror.example/base:1.2.3", "PIP_INDEX_URL=https://pypi.example/simple",
        "TORCH_INDEX_URL=https://torch.example/cpu", f"CA={ca}",
    )  # fmt: skip
    assert "--build-arg BASE_IMAGE=mirror.example/base:1.2.3" in line
    assert "--build-arg PIP_INDEX_URL=https://pypi.example/simple" in line
    assert f"--secret id=ca,src={ca}" in line
    assert ("--build-arg TORCH_INDEX_URL=https://torch.example/cpu" in line) is (
        target == "image-cpu"
    )
    dockerfile = ROOT / re.search(r"-f (\S+)", line).group(1)  # type: ignore[union-attr]
    text = dockerfile.read_text()
    declared = set(re.findall(r"^ARG (\w+)", text, re.M))
    assert {"BASE_IMAGE", "PIP_INDEX_URL"} <= declared
    assert target == "image-gpu" or "TORCH_INDEX_URL" in declared
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f == "${BASE_IMAGE}" for f in froms), froms
    # every RUN that installs packages can trust the CA (a BuildKit secret, not a layer)
    for run in re.findall(r"^RUN .*?(?<!\\)$", text, re.M | re.S):
        if "pip install" in run:
            assert "--mount=type=secret,id=ca" in run and "PIP_CERT" in run, run[:200]


def test_no_dockerfile_pulls_a_frontend_from_docker_hub() -> None:
    """A `# syntax=docker/dockerfile:1` line makes BuildKit pull that image from Docker Hub
    before anything else, whatever BASE_IMAGE says."""
    for dockerfile in (DEPLOY / "docker").glob("Dockerfile.*"):
        assert not re.search(r"^#\s*syntax=", dockerfile.read_text(), re.M), dockerfile.name


@pytest.mark.parametrize("target", ["images", "image-cpu", "image-gpu"])
def test_each_image_target_fails_clearly_without_a_docker_daemon(
    target: str, tmp_path: Path
) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    out = make(target, f"DOCKER={fake}")
    assert out.returncode != 0
    assert "no docker daemon" in out.stderr.lower(), out.stdout + out.stderr
    assert " build " not in out.stdout


def test_make_images_fails_clearly_without_a_docker_daemon(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    out = make("images", f"DOCKER={fake}", env={**os.environ, "PATH": os.environ["PATH"]})
    assert out.returncode != 0
    assert "no docker daemon" in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
    assert " build " not in out.stdout


def referenced_images(rendered: dict[str, list[Doc]]) -> dict[str, str]:
    """image -> where, over every render, the compose file and the Helm values."""
    refs = {}
    for name, docs in rendered.items():
        for where, _, spec in pod_specs(docs):
            for c in containers(spec):
                refs[c["image"]] = f"{name}: {where}"
    compose = yaml.safe_load((DEPLOY / "compose/compose.yaml").read_text())
    for svc, body in compose["services"].items():
        refs[body["image"]] = f"compose: {svc}"
    values = yaml.safe_load((DEPLOY / "helm/values-vllm-stack.yaml").read_text())
    for m in values["servingEngineSpec"]["modelSpec"]:
        refs[f"{m['repository']}:{m['tag']}"] = "helm: engine"
    r = values["routerSpec"]
    refs[f"{r['repository']}:{r['tag']}"] = "helm: router"
    return refs


PINNED = re.compile(r"^[a-z0-9.\-/]+:v?\d+(\.\d+)+[\w.\-]*(@sha256:[0-9a-f]{64})?$")


def test_every_referenced_image_is_ours_or_a_pinned_upstream_one(
    rendered: dict[str, list[Doc]],
) -> None:
    built = set(planned_builds())
    failures = []
    for image, where in referenced_images(rendered).items():
        repo = image.split("@")[0].rsplit(":", 1)[0]
        if repo.rsplit("/", 1)[-1] in OURS:
            if image.rsplit("/", 1)[-1] not in built:
                failures.append(f"{where}: {image} is not built by `make images`")
        elif not PINNED.match(image) or image.endswith(":latest"):
            failures.append(f"{where}: {image} is not at a pinned version tag")
    assert not failures, "\n".join(failures)


def kustomizations() -> list[Path]:
    return sorted((DEPLOY).rglob("kustomization.yaml"))


def test_our_images_get_their_tag_from_a_kustomize_images_entry() -> None:
    """Sources name our images untagged; one `images:` entry sets the version tag (and the
    user's registry, with `kustomize edit set image`). An entry that maps an image onto the
    very name and tag it already has does nothing."""
    for path in (DEPLOY / "k8s").rglob("*.yaml"):
        if path.name == "kustomization.yaml":
            continue
        for image in re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.M):
            if image.split(":")[0].rsplit("/", 1)[-1] in OURS:
                assert ":" not in image, f"{path}: {image} carries its own tag"
    entries = {}
    for k in kustomizations():
        for e in yaml.safe_load(k.read_text()).get("images", []) or []:
            entries[(k, e["name"])] = e
            assert e.get("newTag") or e.get("digest") or e.get("newName", e["name"]) != e["name"], (
                f"{k}: images entry {e} maps {e['name']} onto itself"
            )
    tags = {e["name"]: e.get("newTag") for e in entries.values()}
    assert tags == {"loopstack": f"{VERSION}-cpu", "loopstack-agent-worker": VERSION}, tags


def test_the_worker_image_exists_and_runs_the_worker() -> None:
    text = (DEPLOY / "docker/Dockerfile.worker").read_text()
    assert re.search(r"^FROM \$\{LOOPSTACK_IMAGE\}", text, re.M)
    assert f"ARG LOOPSTACK_IMAGE=loopstack:{VERSION}-cpu" in text
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1] not in ("root", "0")


# ------------------------------------------------------------------------- build context
def dockerignore_allows(path: str) -> bool:
    """.dockerignore semantics for the patterns this repo uses: the last matching line wins."""
    import fnmatch

    allowed = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        hit = fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") or pattern == "**"
        if hit:
            allowed = negate
    return allowed


@pytest.mark.parametrize(
    "dockerfile", sorted((DEPLOY / "docker").glob("Dockerfile.*")), ids=lambda p: p.name
)
def test_each_copy_source_is_in_the_build_context(dockerfile: Path) -> None:
    for src in re.findall(r"^COPY (?!--from)(?:--\S+ )*(.+) \S+$", dockerfile.read_text(), re.M):
        for item in src.split():
            path = item.rstrip("/")
            assert (ROOT / path).exists(), f"{dockerfile.name}: COPY {item}: no such path"
            assert dockerignore_allows(path), f"{dockerfile.name}: {item} is .dockerignored"


def test_the_context_check_sees_an_ignored_path() -> None:
    assert dockerignore_allows("loopstack/serving")
    assert not dockerignore_allows("tests")
    assert not dockerignore_allows("bench/results")


# ----------------------------------------------------------------------------- base image
DEBIAN_STABLE = "trixie"  # Debian 13, stable since 2025-08; bookworm is oldstable


def test_the_python_base_image_is_fully_pinned_and_current() -> None:
    text = (DEPLOY / "docker/Dockerfile.cpu").read_text()
    m = re.search(r"^ARG BASE_IMAGE=python:(\d+)\.(\d+)\.(\d+)-slim-(\w+)$", text, re.M)
    assert m, "the CPU image's python base is not pinned to major.minor.patch-slim-<debian>"
    assert (int(m.group(1)), int(m.group(2))) == sys.version_info[:2]  # what the tests run
    assert m.group(4) == DEBIAN_STABLE, m.group(4)
