"""Fixtures for the serving tests (the fakes live in serving_fakes.py)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # the fakes are imported as tests.unit.serving.serving_fakes
    sys.path.insert(0, str(ROOT))

from tests.unit.serving.serving_fakes import Harness  # noqa: E402


@pytest.fixture
async def make_harness() -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**kw: Any) -> Harness:
        h = Harness(**kw)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.client.aclose()


@pytest.fixture
async def harness(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()
