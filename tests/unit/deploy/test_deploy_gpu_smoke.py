"""deploy/gpu-smoke.sh: it parses and passes shellcheck, and runs end to end against a fake
machine (a fake `docker`, and a `loopstack` whose `serve` is a scripted endpoint,
fake_endpoint.py, while its `bench` commands are the real ones), since no GPU host is at hand
here: with ENGINE=cpu every step passes and the benchmarks print their figures; on the GPU
path, a server that refuses everything makes the run report its failures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.unit.deploy.test_deploy_manifests import DEPLOY, ROOT, run, tool

SMOKE = DEPLOY / "gpu-smoke.sh"


def test_gpu_smoke_script_parses_and_passes_shellcheck() -> None:
    assert run("bash", "-n", str(SMOKE)).returncode == 0
    out = run(tool("shellcheck"), str(SMOKE))
    assert out.returncode == 0, out.stdout + out.stderr
    text = SMOKE.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    assert 'LOOPSTACK" bench agents' in text and "AGENTS=${SMOKE_AGENTS:-1,4,16}" in text
    assert 'LOOPSTACK" bench serving validity' in text
    assert 'LOOPSTACK" bench serving constraint-cost' in text
    assert "python -m bench." not in text and "-m bench." not in text  # the shims are gone
    assert not (ROOT / "loopstack" / "bench" / "tool_validity.py").exists()
    assert not (ROOT / "loopstack" / "bench" / "constraint_cost.py").exists()
    assert 'make install ENGINE="$ENGINE"' in text and "ENGINE=${ENGINE:-gpu}" in text


FAKE_ENDPOINT = Path(__file__).with_name("fake_endpoint.py")


FAKE_DOCKER = '''#!{python}
"""`docker` for the smoke test: info/build succeed (logged to $FAKE_DOCKER_LOG); `run -d`
starts FAKE_LOOPSTACK on the published port with the -e variables; inspect/logs/rm -f act
on that process."""
import os, signal, subprocess, sys

log, state = os.environ["FAKE_DOCKER_LOG"], os.environ["FAKE_DOCKER_LOG"] + ".pid"
args = sys.argv[1:]
with open(log, "a") as fh:
    fh.write(" ".join(args) + "\\n")


def alive():
    try:
        os.kill(int(open(state).read()), 0)
        return True
    except (OSError, ValueError):
        return False


if args[0] == "run":
    env = dict(os.environ)
    port = None
    for flag, value in zip(args, args[1:]):
        if flag == "-p":
            port = value.split(":")[1]
        if flag == "-e":
            name, _, val = value.partition("=")
            env[name] = val if "=" in value else os.environ.get(name, "")
    env["LOOPSTACK_PORT"] = port
    proc = subprocess.Popen([os.environ["FAKE_LOOPSTACK"], "serve"], env=env)
    open(state, "w").write(str(proc.pid))
    print("fakecontainer")
elif args[0] == "inspect":
    print("true" if alive() else "false")
elif args[0] == "rm" and alive():
    os.kill(int(open(state).read()), signal.SIGKILL)
'''


def fake_machine(tmp: Path) -> tuple[dict[str, str], Path]:
    """A PATH with a fake nvidia-smi and docker, and a venv whose `loopstack` is
    FAKE_LOOPSTACK."""
    import os

    bin_dir, venv_bin = tmp / "bin", tmp / "venv" / "bin"
    bin_dir.mkdir()
    venv_bin.mkdir(parents=True)
    scripts = {
        bin_dir / "nvidia-smi": "#!/bin/sh\necho 'name, memory.total'\necho 'Fake GPU, 1 MiB'\n",
        venv_bin / "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
        venv_bin / "loopstack": f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_ENDPOINT}" "$@"\n',
        bin_dir / "docker": FAKE_DOCKER.format(python=sys.executable),
    }
    for path, text in scripts.items():
        path.write_text(text)
        path.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "VENV": str(tmp / "venv"),
        "SMOKE_SKIP_INSTALL": "1",
        "SMOKE_START_TIMEOUT_S": "30",
        "SMOKE_VALIDITY_LIMIT": "1",
        "SMOKE_COST_PROMPTS": "2",
        "SMOKE_AGENTS": "1,2",
        "SMOKE_TASKS_PER_AGENT": "1",
        "FAKE_REFUSE": "1",
        "RESULTS": str(tmp / "results"),
        "PORT": str(free_port()),
        "FAKE_DOCKER_LOG": str(tmp / "docker.log"),
        "FAKE_LOOPSTACK": str(venv_bin / "loopstack"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("LOOPSTACK_API_KEY", None)
    return env, tmp / "results"


def test_gpu_smoke_runs_every_step_reports_failures_and_stops_its_server(tmp_path: Path) -> None:
    """The whole script against a healthy server that refuses every generation: each step runs under
    its limit, the failures are reported (exit 1), and the server is stopped."""
    import socket

    env, results = fake_machine(tmp_path)
    out = subprocess.run(
        ["bash", str(SMOKE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )  # 22-42 s idle; the bound only ends a hung run (it hit 120 s beside a loading server)
    assert out.returncode == 1, out.stdout + out.stderr
    steps = dict(
        line.split("\t")[:2] for line in (results / "steps.tsv").read_text().splitlines()[1:]
    )
    assert steps["serve"] == "ok"
    assert steps["tool_validity"] == steps["constraint_cost"] == "ok"  # they ran...
    assert steps["agents"] == "ok"
    # the GPU image: built from Dockerfile.gpu, run on the GPU, healthy, refused the tool call
    assert steps["image"].startswith("FAILED (exit"), steps["image"]
    docker = (tmp_path / "docker.log").read_text()
    assert "build -f deploy/docker/Dockerfile.gpu -t loopstack:" in docker
    assert re.search(r"^run -d .*--gpus all .*-p 127\.0\.0\.1:\d+:8000", docker, re.M)
    assert "healthy; asking for a tool call" in (results / "image.out").read_text()
    assert docker.rstrip().splitlines()[-1].startswith("rm -f")  # the container is removed
    summary = (results / "summary.txt").read_text()
    assert "PROBLEM: tool_validity: no request was answered" in summary  # ...but got nothing
    assert "PROBLEM: constraint_cost: no successful pair" in summary
    assert "PROBLEM: agents: no task was done" in summary
    assert "prefix cache hit rate over the run: 0.400" in summary
    assert json.loads((results / "tool_validity.json").read_text())["summary"]
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(2)
        s.connect(("127.0.0.1", int(env["PORT"])))


def test_with_engine_cpu_every_step_passes_through_the_cli_and_prints_its_figures(
    tmp_path: Path,
) -> None:
    """ENGINE=cpu, against an endpoint that answers (tool calls, JSON, streams): install is
    skipped, the server starts on the CPU device, the three `loopstack bench` commands run and
    print the tables the CPU benchmarks print, the CPU image is built and run without GPUs and
    answers a tool call, and the run passes. No nvidia-smi is asked."""
    env, results = fake_machine(tmp_path)
    env.pop("FAKE_REFUSE")
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'asked' >&2; exit 9\n")
    out = subprocess.run(
        ["bash", str(SMOKE)], cwd=ROOT, env={**env, "ENGINE": "cpu"}, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    steps = dict(
        line.split("\t")[:2] for line in (results / "steps.tsv").read_text().splitlines()[1:]
    )
    assert steps == {"serve": "ok", "tool_validity": "ok", "constraint_cost": "ok",
                     "agents": "ok", "total_after_install": "-", "image": "ok"}  # fmt: skip
    summary = (results / "summary.txt").read_text()
    assert "no GPU (ENGINE=cpu)" in summary and "PROBLEM" not in summary
    # the validity table of `loopstack bench serving validity`, every mode and arm answered
    assert re.search(r"mode +arm +prompts +http_err +calls +call_rate .*valid/calls", summary)
    for mode in ("auto", "named", "required"):
        assert re.search(rf"^  {mode} +(un)?constrained +1 +0 +1 +100\.0%", summary, re.M), mode
    # the constraint-cost table, with pairs measured
    assert re.search(r"prompts +pairs +decode tok/s con/unc +ratio", summary)
    assert re.search(r"^  tool_required +[1-9]", summary, re.M), summary
    assert "SUMMARY batching gain" in summary  # the agent sweep's own last line
    docker = (tmp_path / "docker.log").read_text()
    assert "build -f deploy/docker/Dockerfile.cpu -t loopstack:" in docker and "-cpu ." in docker
    assert "--gpus" not in docker
    assert "tool call ok: get_weather" in (results / "image.out").read_text()


def test_gpu_smoke_fails_fast_without_a_gpu(tmp_path: Path) -> None:
    env, _ = fake_machine(tmp_path)
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'no devices' >&2; exit 9\n")
    out = subprocess.run(
        ["bash", str(SMOKE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 1 and "FATAL: nvidia-smi failed" in out.stderr


@pytest.mark.parametrize(
    ("name", "argv", "text"),
    [
        (
            "hadolint",
            ["--no-color"],
            "FROM ubuntu:latest\nRUN cd /tmp && apt-get install -y curl\n",
        ),
        ("shellcheck", [], "#!/usr/bin/env bash\nrm -rf $1/*\n"),
        ("yamllint", ["-c", str(DEPLOY / ".yamllint.yaml")], "a:  1\nb: [1,2]   \n"),
    ],
)
def test_the_linters_reject_a_bad_file(
    tmp_path: Path, name: str, argv: list[str], text: str
) -> None:
    bad = tmp_path / "bad"
    bad.write_text(text)
    out = run(tool(name), *argv, str(bad))
    assert out.returncode != 0, out.stdout
