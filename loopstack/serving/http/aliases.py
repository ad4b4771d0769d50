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

On the Anthropic Messages API (``/v1/messages`` and ``count_tokens``) Anthropic's names
(``claude-*``) are also served by default (`ANTHROPIC_NAMES`): Claude Code sends
``claude-haiku-*`` for its background requests however its main model is set, and met a 404
("the model may not exist") unless the operator had mapped it. The operator's aliases are
read first; ``LOOPSTACK_ANTHROPIC_MODEL_NAMES=false`` turns the default off; the start-up log
says which holds (`anthropic_names_note`). The OpenAI APIs keep their 404 for these names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Protocol

from loopstack.serving.exceptions import ModelNotFound

__all__ = [
    "ANTHROPIC_NAMES",
    "CATCH_ALL",
    "anthropic_names_note",
    "check_messages_model",
    "parse_aliases",
    "resolve_model_name",
]

CATCH_ALL = "*"
#: Served on the Messages API by default: every Anthropic model name.
ANTHROPIC_NAMES = "claude-*"
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


class ServedNames(Protocol):
    """What the model check reads of the app's state (its `AppState`)."""

    model_name: str
    model_aliases: dict[str, str]
    anthropic_model_names: bool


def check_messages_model(state: ServedNames, name: str) -> str:
    """The served model a Messages request's `name` stands for: the operator's aliases, then
    (unless turned off) any ``claude-*`` name; otherwise `ModelNotFound` (404)."""
    try:
        return resolve_model_name(name, state.model_name, state.model_aliases)
    except ModelNotFound:
        if state.anthropic_model_names and name.startswith(ANTHROPIC_NAMES[:-1]):
            return state.model_name
        raise


def anthropic_names_note(served: str, enabled: bool) -> str:
    """The start-up line that says whether Anthropic's names are served on /v1/messages."""
    if enabled:
        return (
            f"Anthropic model names ({ANTHROPIC_NAMES}, e.g. Claude Code's claude-haiku-4-5) "
            f"are served on /v1/messages by {served!r} "
            "(LOOPSTACK_ANTHROPIC_MODEL_NAMES=false turns this off)"
        )
    return (
        f"Anthropic model names ({ANTHROPIC_NAMES}) are not served on /v1/messages "
        "(LOOPSTACK_ANTHROPIC_MODEL_NAMES=false) unless LOOPSTACK_MODEL_ALIASES maps them"
    )
