"""Fixtures for the serving tests (the fakes live in serving_fakes.py).

`harness` runs the default constraint backend (guidance); `outlines_harness` the outlines
path; `each_backend` both."""

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


@pytest.fixture
async def outlines_harness(make_harness: Callable[..., Harness]) -> Harness:
    """The outlines backend (regexes, a call in two requests): the tests of that path."""
    return make_harness(backend="outlines")


@pytest.fixture(params=["guidance", "outlines"])
async def each_backend(request: Any, make_harness: Callable[..., Harness]) -> Harness:
    """The default backend and the outlines path: tests of behaviour both must show."""
    return make_harness(backend=request.param)
