"""/v1/chat/completions and /v1/completions requests: SGLang 0.5.10's rules (contract §2) → Jobs + a Plan.

Chat renders `messages` (+ `tools`) with the replica's chat template and tokenizes it (tokenizer_kind.py);
completions take `prompt` as a string or token ids, or a list of those (a batch: one Job per prompt, as
SGLang runs one request per prompt; choice `k * n + i` of the response is choice i of prompt k, and usage
sums the prompts). `max_completion_tokens or max_tokens` (0 = unset, negative: SGLang's max_new_tokens
400) for chat, `max_tokens` (default 16, must be positive: a pydantic 400) for completions; `temperature`
and `top_p` checked as SGLang's SamplingParams.verify (sampler.verify_sampling); `n`, `stop`, `seed`,
`logprobs`, `top_logprobs`, `stream_options`, `response_format` and completions' `json_schema`
(structured_output.py); the cache namespace is `cache_salt + extra_key`. Tool calls: see tool_calls.py.
The outputs of every choice are sampled here, before the engine sees the request; the `Plan` holds them
and everything else the response shapes (openai_shapes.py, openai_stream.py) need. `chat_prompt`,
`chat_sampling` and `chat_outputs` are the chat path's steps, shared with /v1/responses
(responses_request.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from emulator.errors import ApiError, check_context, invalid, is_token_list
from emulator.replica import Job, Replica, new_rid
from emulator.sampler import Completion, Sampling, verify_sampling
from emulator.structured_output import openai_grammar
from emulator.tool_calls import tool_call, tool_target


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a response needs besides the engine's events. Choices are flat over the prompts of a
    batch: choice `k * n + i` is choice i of prompt k (the Job at index k)."""

    chat: bool
    model: str
    created: int
    n: int
    completions: tuple[Completion, ...]
    logprobs: bool
    include_usage: bool
    continuous_usage: bool
    cache_details: bool
    tool_calls: tuple[dict[str, Any] | None, ...]
    echo: tuple[str, ...] | None = None  # completions with `echo`: each prompt's text


Parsed = tuple[tuple[Job, ...], Plan]


def extra_key_of(body: Mapping[str, Any]) -> str | None:
    """SGLang's effective cache namespace of an OpenAI body: `cache_salt` + `extra_key`, concatenated
    (None when neither is given); ApiError when one is not a string."""
    parts = [body.get("cache_salt"), body.get("extra_key")]
    if any(p is not None and not isinstance(p, str) for p in parts):
        raise ApiError("cache_salt and extra_key must be strings")
    present = [p for p in parts if isinstance(p, str)]
    return "".join(present) if present else None


def _int(body: dict[str, Any], key: str, model: str, default: int | None = None) -> int | None:
    value = body.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise invalid(key, model, "Input should be a valid integer [type=int_type]")
    return value


def _stops(body: dict[str, Any], model: str) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise invalid("stop", model, "Input should be a valid string or list of strings")


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise invalid("stream_options", "Request", "Input should be a valid dictionary")
    return bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats"))


def _number(body: dict[str, Any], key: str, model: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(key, model, "Input should be a valid number [type=float_type]")
    return float(value)  # pydantic's float: a JSON -1 is -1.0 in SGLang's messages


def verify_openai_sampling(body: dict[str, Any], model: str) -> None:
    """temperature and top_p as SGLang 0.5.10 verifies them after its pydantic (defaults 1.0 and 1.0)."""
    verify_sampling(_number(body, "temperature", model, 1.0), _number(body, "top_p", model, 1.0))


def chat_sampling(body: dict[str, Any], model: str, max_new: int | None, top: int) -> Sampling:
    """The Sampling of a chat-shaped body: n, seed, stop and the JSON constraint of response_format."""
    n = _int(body, "n", model, 1) or 1
    if n < 1:
        raise ApiError("n must be at least 1")
    seed, stop, grammar = _int(body, "seed", model), _stops(body, model), openai_grammar(body, model)
    return Sampling(max_new=max_new, stop=stop, n=n, seed=seed, top_logprobs=top, grammar=grammar)


def chat_prompt(messages: list[dict[str, Any]], body: dict[str, Any], replica: Replica) -> tuple[int, ...]:
    """The prompt ids of chat messages: the replica's chat template over them and the body's tools."""
    return tuple(replica.tokenizer.chat_ids(messages, body.get("tools"), body))


def chat_outputs(
    body: dict[str, Any], replica: Replica, prompt: tuple[int, ...], sampling: Sampling, messages: list[Any]
) -> tuple[tuple[Completion, ...], tuple[dict[str, Any] | None, ...]]:
    """Each choice's output and tool call (None: text, or the JSON text of a response_format)."""
    target = tool_target(body, replica.cfg.tool_call_parser, messages)
    comps: list[Completion] = []
    calls: list[dict[str, Any] | None] = []
    for i in range(sampling.n):
        if target is not None:
            call, comp = tool_call(replica.sampler, target, prompt, sampling.seed, i)
            calls.append(call)
            comps.append(comp)
        else:
            calls.append(None)
            comps.append(replica.sampler.sample(prompt, sampling, i))
    return tuple(comps), tuple(calls)


def parse_chat(body: dict[str, Any], replica: Replica) -> Parsed:
    name = "ChatCompletionRequest"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise invalid("messages", name, "Field required: a non-empty list of messages [type=missing]")
    prompt = chat_prompt(messages, body, replica)
    max_new = _int(body, "max_completion_tokens", name) or _int(body, "max_tokens", name) or None
    logprobs = bool(body.get("logprobs"))
    top = _int(body, "top_logprobs", name, 0) or 0
    if top and not logprobs:
        raise ApiError("top_logprobs requires logprobs to be true")
    check_context(len(prompt), max_new, replica.cfg.context_length, replica.cfg.max_req_input_len)
    verify_openai_sampling(body, name)
    if max_new is not None and max_new < 0:  # SamplingParams.verify, after temperature and top_p
        raise ApiError(f"max_new_tokens must be at least 0, got {max_new}.")
    sampling = chat_sampling(body, name, max_new, top)
    comps, calls = chat_outputs(body, replica, prompt, sampling, messages)
    plan = _plan(body, replica, True, sampling.n, comps, logprobs, calls)
    return (_job(body, prompt, sampling, _rids(body, 1)[0]),), plan


def parse_completion(body: dict[str, Any], replica: Replica) -> Parsed:
    """One Job per prompt of a batch (`prompt` a list of strings or of token-id lists), n choices each."""
    name = "CompletionRequest"
    if "prompt" not in body:
        raise invalid("prompt", name, "Field required [type=missing]")
    prompts = [_prompt(p, replica) for p in _batch(body["prompt"])]
    max_new = _max_tokens(body, name)
    lp = _int(body, "logprobs", name)
    for _text, ids in prompts:
        check_context(len(ids), max_new, replica.cfg.context_length, replica.cfg.max_req_input_len)
    verify_openai_sampling(body, name)
    sampling = chat_sampling(body, name, max_new, lp or 0)
    comps = tuple(replica.sampler.sample(p, sampling, i) for _t, p in prompts for i in range(sampling.n))
    echo = tuple(text for text, _ids in prompts) if body.get("echo") else None
    calls = (None,) * len(comps)
    plan = _plan(body, replica, False, sampling.n, comps, lp is not None, calls, echo)
    rids = _rids(body, len(prompts))
    return tuple(_job(body, p, sampling, rid) for (_t, p), rid in zip(prompts, rids, strict=True)), plan


def _max_tokens(body: dict[str, Any], model: str) -> int:
    """Completions' `max_tokens: int = 16` and its pydantic field validator (SGLang 0.5.10 protocol.py
    `validate_max_tokens_positive`: `raise ValueError("max_tokens must be positive")`), so 0 or less is
    FastAPI's 400 "Bad Request" validation error, not the handler's BadRequestError."""
    value = body.get("max_tokens", 16)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid("max_tokens", model, "Input should be a valid integer [type=int_type]")
    if value <= 0:
        detail = f"Value error, max_tokens must be positive [type=value_error, input_value={value}]"
        raise invalid("max_tokens", model, detail)
    return value


def _batch(value: object) -> list[object]:
    """The prompts of `prompt`: a string or token ids is one; a list of strings or of id lists, many."""
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        return list(value)
    return [value]


def _prompt(value: object, replica: Replica) -> tuple[str, tuple[int, ...]]:
    if isinstance(value, str):
        return value, tuple(replica.tokenizer.encode(value))
    if isinstance(value, list) and value and is_token_list(value):
        return replica.tokenizer.decode(value), tuple(value)
    detail = "Input should be a string, a list of token ids, or a list of those (a batch)"
    raise invalid("prompt", "CompletionRequest", detail)


def _rids(body: dict[str, Any], count: int) -> list[str]:
    """The request ids: `rid` (a string; `rid_k` for prompt k of a batch, or a list of one per prompt)."""
    rid = body.get("rid")
    if isinstance(rid, list) and len(rid) == count and all(isinstance(r, str) for r in rid):
        return list(rid)
    if isinstance(rid, str):
        return [rid] if count == 1 else [f"{rid}_{k}" for k in range(count)]
    if rid is not None:
        raise ApiError(f"rid must be a string or a list of {count} strings")
    return [new_rid() for _ in range(count)]


def _job(body: dict[str, Any], prompt: tuple[int, ...], sampling: Sampling, rid: str) -> Job:
    return Job(prompt, sampling, extra_key_of(body), rid, bool(body.get("stream")))


def _plan(
    body: dict[str, Any],
    replica: Replica,
    chat: bool,
    n: int,
    comps: tuple[Completion, ...],
    logprobs: bool,
    calls: tuple[dict[str, Any] | None, ...],
    echo: tuple[str, ...] | None = None,
) -> Plan:
    include, continuous = _stream_options(body)
    model = body.get("model")
    return Plan(
        chat=chat,
        model=model if isinstance(model, str) else replica.cfg.served_model_name,
        created=int(time.time()),
        n=n,
        completions=comps,
        logprobs=logprobs,
        include_usage=include or continuous,
        continuous_usage=continuous,
        cache_details=bool(body.get("return_cached_tokens_details")),
        tool_calls=calls,
        echo=echo,
    )
