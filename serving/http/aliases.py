"""Model names clients send by default, mapped onto the served model (``LOOPSTACK_MODEL_ALIASES``).

Harnesses send names of their vendors' models: the Agents SDK ``gpt-4.1``/``gpt-5...``,
Claude Code ``claude-sonnet-...`` for its main loop and ``claude-...-haiku`` for background
work. The operator maps them::

    LOOPSTACK_MODEL_ALIASES='claude-sonnet-4-5=qwen,claude-haiku-4-5=qwen'
    LOOPSTACK_MODEL_ALIASES='{"gpt-5": "qwen", "*": "qwen"}'   # JSON works too
    LOOPSTACK_MODEL_ALIASES='*'                                  # every name: the served model

``*`` is the catch-all (a bare ``*`` means ``*=<served model>``); a name ending in ``*`` maps
every name with that prefix (``claude-*=qwen``). Every generating API (chat, completions,
responses, messages, count_tokens) resolves its ``model`` here; a name that is neither served
nor mapped is a 404 ``model_not_found`` that lists what is served.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from serving.exceptions import ModelNotFound

__all__ = ["CATCH_ALL", "parse_aliases", "resolve_model_name"]

CATCH_ALL = "*"
_NAME = re.compile(r"[\w.:/@+-]+\*?|\*")  # a model name, or a prefix ending in *


def parse_aliases(text: str, served: str) -> dict[str, str]:
    """The alias map of ``LOOPSTACK_MODEL_ALIASES`` (JSON object or ``name=target,...``).
    Raises ValueError for a malformed value or a target that is not `served`."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        raw = json.loads(text)
        if not isinstance(raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
        ):
            raise ValueError("LOOPSTACK_MODEL_ALIASES: a JSON object of names to names")
        pairs = list(raw.items())
    else:
        pairs = []
        for item in text.split(","):
            if not item.strip():
                continue
            name, sep, target = item.partition("=")
            pairs.append((name.strip(), target.strip() if sep else served))
    aliases: dict[str, str] = {}
    for name, target in pairs:
        if not _NAME.fullmatch(name):
            raise ValueError(f"LOOPSTACK_MODEL_ALIASES: {name!r} is not a model name")
        target = target or served
        if target != served:
            raise ValueError(
                f"LOOPSTACK_MODEL_ALIASES: {name!r} maps to {target!r}, which is not served "
                f"(this server serves {served!r})"
            )
        aliases[name] = target
    return aliases


def resolve_model_name(name: str, served: str, aliases: Mapping[str, str]) -> str:
    """The served model `name` stands for, or `ModelNotFound` (404) listing what is served."""
    if name == served:
        return served
    if name in aliases:
        return aliases[name]
    prefixes = [k for k in aliases if k.endswith(CATCH_ALL) and k != CATCH_ALL]
    for prefix in sorted(prefixes, key=len, reverse=True):
        if name.startswith(prefix[:-1]):
            return aliases[prefix]
    if CATCH_ALL in aliases:
        return aliases[CATCH_ALL]
    raise ModelNotFound(name, served=[served])
