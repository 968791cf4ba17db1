"""Non-stream JSON bodies of SGLang's OpenAI routes (contract §2), and the usage and logprobs shapes that
streams (openai_stream.py) share.

Bodies: `chat.completion` / `text_completion` with `choices`, `usage` (prompt tokens counted once per
prompt, completion tokens summed over choices, `prompt_tokens_details` only with --enable-cache-report
and null when 0), `metadata.weight_version`, and `sglext.cached_tokens_details` when the request asked
`return_cached_tokens_details`. Chat logprobs are OpenAI's `content[{token, bytes, logprob,
top_logprobs}]`; completions' are the legacy `{text_offset, token_logprobs, tokens, top_logprobs}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emulator.openai_request import Plan
from emulator.replica import WEIGHT_VERSION, Job, Run
from emulator.sampler import Completion


# ---- usage and logprobs ---------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached: int, report: bool) -> dict[str, Any]:
    details = {"cached_tokens": cached} if report and cached > 0 else None
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
    }


def chat_logprobs(comp: Completion, start: int, end: int) -> dict[str, Any]:
    def entry(token: str, lp: float) -> dict[str, Any]:
        return {"token": token, "bytes": list(token.encode()), "logprob": lp}

    content = [
        {**entry(comp.pieces[i], comp.logprobs[i]), "top_logprobs": [entry(t, lp) for t, lp in comp.top[i]]}
        for i in range(start, end)
    ]
    return {"content": content}


def legacy_logprobs(comp: Completion, start: int, end: int, offset: int) -> dict[str, Any]:
    offsets, pos = [], offset
    for i in range(start, end):
        offsets.append(pos)
        pos += len(comp.pieces[i])
    return {
        "text_offset": offsets,
        "token_logprobs": list(comp.logprobs[start:end]),
        "tokens": list(comp.pieces[start:end]),
        "top_logprobs": [dict(comp.top[i]) for i in range(start, end)] if comp.top and comp.top[0] else None,
    }


# ---- non-stream bodies ----------------------------------------------------------------------
def full_body(plan: Plan, jobs: Sequence[Job], runs: Sequence[Run], report: bool) -> dict[str, Any]:
    """The response to one request (every prompt of a batch): the id of its first prompt's request."""
    comps = plan.completions
    choices = [
        _chat_choice(plan, i, c) if plan.chat else _text_choice(plan, i, c) for i, c in enumerate(comps)
    ]
    out_tokens = sum(len(c.ids) for c in comps)
    body: dict[str, Any] = {
        "id": jobs[0].rid,
        "object": "chat.completion" if plan.chat else "text_completion",
        "created": plan.created,
        "model": plan.model,
        "choices": choices,
        "usage": batch_usage(jobs, runs, out_tokens, report),
        "metadata": {"weight_version": WEIGHT_VERSION},
    }
    details = _summed_details(runs)
    if plan.cache_details and details is not None:
        body["sglext"] = {"cached_tokens_details": details}
    return body


def batch_usage(
    jobs: Sequence[Job], runs: Sequence[Run], completion_tokens: int, report: bool
) -> dict[str, Any]:
    """Prompt and cached tokens once per prompt (summed over a batch), completion tokens over choices."""
    prompt = sum(len(job.prompt) for job in jobs)
    return usage(prompt, completion_tokens, sum(run.cached_tokens for run in runs), report)


def _summed_details(runs: Sequence[Run]) -> dict[str, Any] | None:
    """cached_tokens_details of the request: each tier's tokens summed over its prompts."""
    each = [d for d in (run.cached_details() for run in runs) if d is not None]
    if not each:
        return None
    total = dict(each[0])
    for details in each[1:]:
        total |= {k: total[k] + v for k, v in details.items() if isinstance(v, int)}
    return total


def _chat_choice(plan: Plan, i: int, comp: Completion) -> dict[str, Any]:
    call = plan.tool_calls[i]
    message = {
        "role": "assistant",
        "content": None if call else comp.text,
        "reasoning_content": None,
        "tool_calls": [call] if call else None,
    }
    return {
        "index": i,
        "message": message,
        "logprobs": chat_logprobs(comp, 0, len(comp.ids)) if plan.logprobs else None,
        "finish_reason": comp.finish,
        "matched_stop": comp.matched,
    }


def _text_choice(plan: Plan, i: int, comp: Completion) -> dict[str, Any]:
    prefix = plan.echo[i // plan.n] if plan.echo else ""
    lps = legacy_logprobs(comp, 0, len(comp.ids), len(prefix)) if plan.logprobs else None
    return {
        "index": i,
        "text": prefix + comp.text,
        "logprobs": lps,
        "finish_reason": comp.finish,
        "matched_stop": comp.matched,
    }
