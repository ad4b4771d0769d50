"""Fixtures: every agent test writes its traces under a temporary LOOPSTACK_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOOPSTACK_HOME", str(tmp_path / "home"))
    for var in ("LOOPSTACK_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home"
