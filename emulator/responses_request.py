"""A /v1/responses request → a `ResponsesCall` (what the response echoes) and a `ResponsesPlan` (what runs).

The checks are SGLang 0.5.23's `create_responses`, in its order, after the field validation of
responses_fields.py (responses-contract §1.1, §1.2, §1.5, §1.8); each is a 400 `invalid_request_error`
unless said otherwise:

1. a `shell` tool: "Shell tools are not supported by this model" (param tools);
2. with the store off (the default), `previous_response_id` then `background`: "Response store is
   disabled. ..." (param previous_response_id / background); `background` without `store`: param store;
3. a `model` other than the served name (or `served:adapter`): 404 "The model 'x' does not exist";
4. `tool_choice: "required"` without a function or custom tool; a named tool not declared (param
   tool_choice); `message.output_text.logprobs` with `stream` (param logprobs);
5. `previous_response_id` without the `resp_` prefix (param response_id), or not stored: 404.

Planning (`plan`) then renders the history as chat messages (responses_input.py) and runs THE CHAT PATH's
steps on a chat-shaped body (openai_request.chat_prompt / chat_sampling / chat_outputs): the same chat
template, tokens, tool calls and JSON constraints, so a Responses turn shares its prefix cache with the
equivalent chat request. A failing step is SGLang's `f"{e} {e.__cause__}"` 400 (a missing `model` fails
its internal ChatCompletionRequest the same way). The budget is `max_output_tokens - 2`; temperature
defaults to 0.7. The context-length check and SamplingParams.verify are the engine's: `engine_error`
holds their message (a 400 when not streaming, a `response.failed` event when streaming, as in SGLang).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from emulator.errors import ApiError, check_context
from emulator.openai_request import chat_outputs, chat_prompt, chat_sampling, extra_key_of
from emulator.replica import Job, Replica
from emulator.response_store import ResponseStore
from emulator.responses_fields import tool_dump, validate
from emulator.responses_input import InputItemError, chat_messages, history
from emulator.sampler import Completion, verify_sampling

STORE_DISABLED = (
    "Response store is disabled. Stateful Responses require --enable-response-store on a standalone "
    "server; response storage is unavailable in PD mode."
)
_COMBINED = (
    "Cannot combine tool calls with constrained decoding (text.format / regex / ebnf / structural_tag / "
    "json_schema). Remove one."
)


def request_error(message: str, param: str | None = None, status: int = 400) -> ApiError:
    return ApiError(message, status, "invalid_request_error", param)


def store_disabled(param: str) -> ApiError:
    return request_error(STORE_DISABLED, param)


def id_errors(response_id: str) -> ApiError:
    """The bad-prefix 400 (the caller checks the prefix first)."""
    return request_error(
        f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'.", "response_id"
    )


def not_found(response_id: str) -> ApiError:
    return request_error(f"Response with id '{response_id}' not found.", "response_id", 404)


@dataclass(frozen=True, slots=True)
class ResponsesCall:
    """A validated request: what the response echoes and the store keeps."""

    body: dict[str, Any]
    request_id: str
    created_at: int
    tools: tuple[dict[str, Any], ...]  # as echoed (tool_dump)
    tool_choice: str | dict[str, Any]  # SGLang's effective_tool_choice()
    persist: bool  # the store flag is on and `store` is true
    history: tuple[Any, ...]  # the chain's items + this input (what the store keeps)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def background(self) -> bool:
        return bool(self.body.get("background")) and not self.stream

    @property
    def logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.body.get("include") or [])

    @property
    def calls_tools(self) -> bool:
        """Function or custom tools and a tool_choice other than none: the stream buffers its message."""
        return bool(_chat_tools(self)) and self.tool_choice != "none"


@dataclass(frozen=True, slots=True)
class ResponsesPlan:
    """What the engine runs: the job, the sampled output, the tool call (or None)."""

    job: Job
    completion: Completion
    call: dict[str, Any] | None
    engine_error: str | None


def parse(body: dict[str, Any], replica: Replica, store: ResponseStore) -> ResponsesCall:
    """Validate (400/404 ApiErrors, module docstring); a previous response comes from `store`."""
    validate(body)
    store_on, keep = replica.cfg.enable_response_store, bool(body.get("store", True))  # null: not kept
    tools = tuple(tool_dump(t) for t in body.get("tools") or [])
    if any(t["type"] == "shell" for t in tools):
        raise request_error("Shell tools are not supported by this model", "tools")
    prev = body.get("previous_response_id")
    if not store_on and prev is not None:
        raise store_disabled("previous_response_id")
    if not store_on and body.get("background"):
        raise store_disabled("background")
    if body.get("background") and not keep:
        raise request_error("background=true requires store=true.", "store")
    _check_model(body.get("model"), replica.cfg.served_model_name)
    choice = _effective_choice(body.get("tool_choice", "auto"))
    _check_tool_choice(body, tools, choice)
    if prev is not None and not prev.startswith("resp_"):
        raise id_errors(prev)
    previous = store.chain(prev) if prev is not None else []
    if previous is None:
        raise not_found(str(prev))
    items = history(previous, body["input"])
    request_id = body.get("request_id") or f"resp_{uuid.uuid4().hex}"
    return ResponsesCall(body, request_id, int(time.time()), tools, choice, store_on and keep, tuple(items))


def _check_model(model: str | None, served: str) -> None:
    if model is None or model == served or model.startswith(f"{served}:"):
        return
    raise request_error(f"The model '{model}' does not exist", "model", 404)


def _effective_choice(choice: Any) -> str | dict[str, Any]:
    if not isinstance(choice, dict):
        return str(choice)
    name = choice.get("name") or (choice.get("function") or {}).get("name")
    if choice.get("type") in ("function", "custom") and name:
        return {"type": choice["type"], "name": name}
    return "auto"


def _check_tool_choice(body: dict[str, Any], tools: tuple[dict[str, Any], ...], choice: Any) -> None:
    callable_ = [t for t in tools if t["type"] in ("function", "custom")]
    if body.get("tool_choice") == "required" and not callable_:
        raise request_error(
            'tool_choice="required" requires at least one tool with type="function" or type="custom"; '
            "other built-in tool types cannot be forced."
        )
    if isinstance(choice, dict) and not any(t["name"] == choice["name"] for t in callable_):
        raise request_error(f"Tool {choice['name']!r} is not declared in tools", "tool_choice")
    if body.get("stream") and "message.output_text.logprobs" in (body.get("include") or []):
        raise request_error("logprobs are not supported in streaming mode", "logprobs")


def _chat_tools(call: ResponsesCall) -> list[dict[str, Any]]:
    """The function tools chat sees: `function` tools, and `custom` ones as a one-string function."""
    out = []
    for tool in call.tools:
        if tool["type"] == "function":
            desc, params = tool["description"], tool["parameters"]
        elif tool["type"] == "custom" and tool["name"]:
            desc, params = tool["description"], _CUSTOM_PARAMETERS
        else:
            continue
        fn = {"name": tool["name"], "description": desc, "parameters": params, "strict": tool["strict"]}
        out.append({"type": "function", "function": fn})
    return out


_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
    "required": ["input"],
    "additionalProperties": False,
}


def chat_body(call: ResponsesCall) -> dict[str, Any]:
    """The chat request SGLang builds from a Responses request (`_make_request`, `to_sampling_params`)."""
    body, tools = call.body, _chat_tools(call)
    choice = call.tool_choice
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort", "medium") if isinstance(reasoning, dict) else None
    kwargs = body.get("chat_template_kwargs")
    if effort == "none":
        kwargs = {"thinking": False, "enable_thinking": False, **(kwargs or {})}
    fmt = (body.get("text") or {}).get("format") or {}
    response_format: dict[str, Any] | None = None
    if fmt.get("type") == "json_object":
        response_format = {"type": "json_object"}
    elif fmt.get("type") == "json_schema":
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": fmt["name"], "schema": fmt["schema"]},
        }
    return {
        "tools": tools or None,
        "tool_choice": choice if tools else "none",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "stop": body.get("stop"),
        "reasoning_effort": effort,
        "chat_template_kwargs": kwargs,
        "response_format": response_format,
        "cache_salt": body.get("cache_salt"),
        "extra_key": body.get("extra_key"),
    }


def plan(call: ResponsesCall, replica: Replica) -> ResponsesPlan:
    """Render, tokenize and sample through the chat path; raises the 400s of SGLang's `_make_request`."""
    chat = chat_body(call)
    if call.body.get("model") is None:
        detail = "Input should be a valid string [type=string_type, input_value=None, input_type=NoneType]"
        raise request_error(f"1 validation error for ChatCompletionRequest\nmodel\n  {detail} None")
    try:
        messages = chat_messages(call.history, call.body.get("instructions"), replica.tokenizer)
        prompt = chat_prompt(messages, chat, replica)
    except InputItemError as exc:
        raise request_error(f"{exc} None") from exc
    except ApiError as exc:  # the chat template's error
        raise request_error(f"{exc.message} None") from exc
    limit = call.body.get("max_output_tokens")
    max_new = None if limit is None else limit - 2
    sampling = chat_sampling(chat, "ResponsesRequest", max_new, call.body.get("top_logprobs") or 0)
    if sampling.grammar is not None and chat["tools"] and (chat["tool_choice"] not in ("auto", "none")):
        raise request_error(_COMBINED)
    comps, calls = chat_outputs(chat, replica, prompt, sampling, messages)
    job = Job(prompt, sampling, extra_key_of(chat), call.request_id, call.stream)
    return ResponsesPlan(job, comps[0], calls[0], _engine_error(call, replica, prompt, max_new))


def _engine_error(
    call: ResponsesCall, replica: Replica, prompt: tuple[int, ...], max_new: int | None
) -> str | None:
    """The tokenizer manager's ValueError, if any: the context check, then SamplingParams.verify."""
    body = call.body
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    try:
        check_context(len(prompt), max_new, replica.cfg.context_length, replica.cfg.max_req_input_len)
        t = 0.7 if temperature is None else float(temperature)  # pydantic's Optional[float]: -1 is -1.0
        verify_sampling(t, 1.0 if top_p is None else float(top_p), True)
        if max_new is not None and max_new < 0:
            raise ApiError(f"max_new_tokens must be at least 0, got {max_new}.")
    except ApiError as err:
        return err.message
    return None
