"""Chat messages -> the prompt text the engine completes, with the model's own chat template.

The tool-call path renders prompts here (not in vLLM) because it must control the end of the
prompt: a constrained call starts right after ``<tool_call>\\n``. Messages arrive in OpenAI
shape and are normalised the way vLLM does it before templating: assistant tool-call
``arguments`` strings become objects, content-part lists become text.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from loopstack.serving.config import NO_THINKING
from loopstack.serving.constraint.envelope import TOOL_CALL_OPEN
from loopstack.serving.exceptions import InvalidRequest

logger = logging.getLogger(__name__)
__all__ = ["TOOL_CALL_OPEN", "BackgroundTokenizer", "PromptBuilder"]

# For chat templates that do not render `tools` themselves (e.g. SmolLM2's).
_FALLBACK_TOOL_PROMPT = (
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class BackgroundTokenizer:
    """A tokenizer that loads in a thread from the moment this is built.

    Importing transformers and reading the tokenizer take ~13 s of one core. `serve` starts
    the engine (its own processes) meanwhile instead of after. `get()` waits for the load and
    raises what it raised."""

    def __init__(self, load: Callable[[], Any]):
        self._load = load
        self._done = threading.Event()
        self._tokenizer: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="tokenizer-load", daemon=True).start()

    def _run(self) -> None:
        try:
            self._tokenizer = self._load()
        except BaseException as exc:  # handed to whoever waits in get()
            self._error = exc
        finally:
            self._done.set()

    def get(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._tokenizer


class PromptBuilder:
    """Renders OpenAI chat messages with a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer: Any, *, max_model_len: int | None = None):
        self._tokenizer = tokenizer  # or a BackgroundTokenizer, resolved on first use
        self.max_model_len = max_model_len

    @property
    def tokenizer(self) -> Any:
        if isinstance(self._tokenizer, BackgroundTokenizer):
            self._tokenizer = self._tokenizer.get()
        return self._tokenizer

    @functools.cached_property
    def template_thinks(self) -> bool:
        return "enable_thinking" in (getattr(self.tokenizer, "chat_template", None) or "")

    @functools.cached_property
    def template_renders_tools(self) -> bool:
        return "tools" in (getattr(self.tokenizer, "chat_template", None) or "")

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        conversation = [_normalise(m) for m in messages]
        kwargs: dict[str, Any] = {}
        if self.template_thinks:  # a tool turn is never a thinking turn (Qwen3: an empty block)
            kwargs.update(NO_THINKING)
        if tools and self.template_renders_tools:
            kwargs["tools"] = tools
        elif tools:
            listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            system = _FALLBACK_TOOL_PROMPT.format(tools=listing)
            if conversation and conversation[0]["role"] == "system":
                conversation[0] = {
                    **conversation[0],
                    "content": f"{conversation[0]['content']}\n\n{system}",
                }
            else:
                conversation.insert(0, {"role": "system", "content": system})
        tokenizer = self.tokenizer  # a failed load is not the request's fault: not a 400
        try:
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as exc:  # jinja raises on shapes the template rejects
            raise InvalidRequest(
                f"messages could not be rendered by the chat template: {exc}"
            ) from exc
        return str(text)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def check_fits(self, prompt: str, max_tokens: int) -> int:
        """Token count of `prompt`; InvalidRequest if prompt + max_tokens exceed the context."""
        n = self.count_tokens(prompt)
        if self.max_model_len is not None and n + max_tokens > self.max_model_len:
            raise InvalidRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {n + max_tokens} tokens ({n} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion.",
                param="messages",
                code="context_length_exceeded",
            )
        return n


def _normalise(message: dict[str, Any]) -> dict[str, Any]:
    msg = dict(message)
    content = msg.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequest("only text content parts are supported", param="messages")
            texts.append(str(part.get("text", "")))
        msg["content"] = "".join(texts)
    elif content is None:
        msg["content"] = ""
    if msg.get("role") == "developer":
        msg["role"] = "system"
    if msg.get("tool_calls"):
        calls = []
        for call in msg["tool_calls"]:
            fn = dict(call.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError as exc:
                    raise InvalidRequest(
                        f"assistant tool_call arguments are not JSON: {exc}", param="messages"
                    ) from exc
            calls.append({**call, "function": fn})
        msg["tool_calls"] = calls
    return msg
