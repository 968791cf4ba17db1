"""Response and conversation ids belong to the client that made them (``ApiKey.bucket``: its tenant, or
the key alone): for any other client every route answers exactly the 404 of an unknown id. Without
``--api-keys`` everyone is one client."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest

from tests.proxy.conftest import MODEL, StackFactory
from tests.proxy.responses.conftest import ASK, client

KEYS = json.dumps(
    [
        {"key": "sk-acme-1", "tenant": "acme"},
        {"key": "sk-acme-2", "tenant": "acme"},
        {"key": "sk-globex", "tenant": "globex"},
        {"key": "sk-alone"},
    ]
)
UNKNOWN = "resp_" + "f" * 32


async def _error(call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    with pytest.raises(openai.APIStatusError) as info:
        await call()
    body = info.value.body
    assert isinstance(body, dict)
    return info.value.status_code, {k: v for k, v in body.items() if k != "message"}


async def _errors(sdk: openai.AsyncOpenAI, ident: str) -> list[tuple[int, Any]]:
    """What every route that takes a response id answers ``sdk`` for ``ident``."""
    return [
        await _error(lambda: sdk.responses.retrieve(ident)),
        await _error(lambda: sdk.responses.delete(ident)),
        await _error(lambda: sdk.responses.cancel(ident)),
        await _error(lambda: sdk.responses.input_items.list(ident)),
        await _error(lambda: sdk.responses.create(model=MODEL, input="x", previous_response_id=ident)),
    ]


async def test_other_clients_get_the_404_of_an_unknown_id(stack_factory: StackFactory) -> None:
    stack = await stack_factory(api_keys=KEYS)
    async with client(stack.url, "sk-acme-1") as acme, client(stack.url, "sk-acme-2") as colleague:
        made = await acme.responses.create(model=MODEL, input=ASK, max_output_tokens=8)
        conv = await acme.conversations.create(items=[{"role": "user", "content": "x"}])
        assert (await colleague.responses.retrieve(made.id)).id == made.id  # one tenant, one owner
        assert (await colleague.conversations.retrieve(conv.id)).id == conv.id
        for key in ("sk-globex", "sk-alone"):
            async with client(stack.url, key) as other:
                theirs, unknown = await _errors(other, made.id), await _errors(other, UNKNOWN)
                assert theirs == unknown and {status for status, _ in theirs} == {404}
                with pytest.raises(openai.NotFoundError):
                    await other.conversations.retrieve(conv.id)
                with pytest.raises(openai.NotFoundError):
                    await other.conversations.items.list(conv.id)
                with pytest.raises(openai.NotFoundError):
                    await other.responses.create(model=MODEL, input="x", conversation=conv.id)
        assert (await acme.responses.retrieve(made.id)).id == made.id  # nothing was deleted by the others
    async with client(stack.url, "sk-wrong") as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.responses.retrieve(made.id)


async def test_an_open_gateway_is_one_owner(stack_factory: StackFactory) -> None:
    stack = await stack_factory()
    async with client(stack.url, "one") as a, client(stack.url, "two") as b:
        made = await a.responses.create(model=MODEL, input=ASK, max_output_tokens=8)
        assert (await b.responses.retrieve(made.id)).id == made.id
