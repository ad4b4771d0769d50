"""The served model in Codex CLI's catalogue shape (``GET /v1/models`` -> ``models``).

Codex reads ``{base_url}/models`` and expects ``{"models": [ModelInfo]}`` (codex-rs
``protocol/src/openai_models.rs``); without it, it warns ("Model metadata ... not found")
and falls back. What we say: no reasoning levels, the shell as a ``shell_command``
function, ``apply_patch`` as a free-form (custom) tool, one call per turn, the context
window we serve, and short base instructions (a small model does better with them than
with Codex's ~4k-token default).
"""

from __future__ import annotations

from typing import Any, Protocol

BASE_INSTRUCTIONS = (
    "You are a coding agent running in the user's terminal. Use the tools to inspect and "
    "change files in the workspace: run shell commands to read files, edit files with "
    "apply_patch. Keep answers short, and finish with a brief summary of what you did."
)


class _Served(Protocol):
    model_name: str
    max_model_len: int | None


def codex_model_info(state: _Served) -> dict[str, Any]:
    return {
        "slug": state.model_name,
        "display_name": state.model_name,
        "description": "served by loopstack",
        "supported_reasoning_levels": [],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
        "upgrade": None,
        "base_instructions": BASE_INSTRUCTIONS,
        "supports_reasoning_summaries": False,
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "truncation_policy": {"mode": "tokens", "limit": 10_000},
        "supports_parallel_tool_calls": False,
        "context_window": state.max_model_len,
        "experimental_supported_tools": [],
        "input_modalities": ["text"],
    }
