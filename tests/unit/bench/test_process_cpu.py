"""The CPU-by-process profile (#40): snapshots of a real process tree, their difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopstack.bench.load.process_cpu import diff, kind, main, snapshot


def test_kinds_of_a_servers_processes() -> None:
    assert kind("VLLM::EngineCore") == "engine core"
    assert kind("VLLM::Worker") == "worker"
    assert kind("python -m vllm.entrypoints.openai.api_server --model m") == "vllm api server"
    assert kind(".venv/bin/python .venv/bin/loopstack serve") == "loopstack serve"
    assert kind("postgres: writer") == "other"


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"


def test_a_busy_child_shows_up_in_the_difference() -> None:
    before = snapshot([os.getpid()])
    child = subprocess.Popen([sys.executable, "-c", BURN + "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        used: dict[tuple[int, str], float] = {}
        while time.monotonic() < deadline:
            used = diff(before, snapshot([os.getpid()]))
            if sum(used.values()) >= 0.4:
                break
            time.sleep(0.05)
        assert sum(used.values()) >= 0.4, used  # the child's 0.5 s of CPU, counted from zero
    finally:
        child.kill()
        child.wait()


def test_a_process_that_started_in_between_counts_from_zero() -> None:
    before = {"t": 0.0, "procs": [{"root": 1, "pid": 10, "kind": "worker", "cpu_s": 5.0}]}
    after = {
        "t": 9.0,
        "procs": [
            {"root": 1, "pid": 10, "kind": "worker", "cpu_s": 7.5},
            {"root": 1, "pid": 11, "kind": "engine core", "cpu_s": 1.0},
        ],
    }
    assert diff(before, after) == {(1, "worker"): 2.5, (1, "engine core"): 1.0}


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", str(os.getpid())]) == 0
    snap = capsys.readouterr().out
    (tmp_path / "a.json").write_text(snap)
    (tmp_path / "b.json").write_text(snap)
    assert json.loads(snap)["procs"][0]["pid"] == os.getpid()
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert "CPU-s" in capsys.readouterr().out
