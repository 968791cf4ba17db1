"""The Conversations API served by kvroute, with the real openai SDK: create with items, responses in a
conversation (its items before the input, the turn's items appended), items listed, paged, added,
retrieved and deleted, metadata updated, the conversation deleted, and the errors."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.proxy.conftest import MODEL, SYSTEM
from tests.proxy.responses.conftest import ASK

LONG = str(SYSTEM["content"])


async def test_responses_in_a_conversation(sdk: AsyncOpenAI) -> None:
    conv = await sdk.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Remember the word 'radix'."}],
        metadata={"topic": "caches"},
    )
    assert (
        conv.id.startswith("conv_") and conv.metadata == {"topic": "caches"} and conv.object == "conversation"
    )
    first = await sdk.responses.create(model=MODEL, input=ASK, conversation=conv.id, instructions=LONG)
    assert first.conversation is not None and first.conversation.id == conv.id
    second = await sdk.responses.create(
        model=MODEL, input="and then?", conversation={"id": conv.id}, instructions=LONG
    )
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    items = [i async for i in sdk.conversations.items.list(conv.id, order="asc")]
    texts = [getattr(i, "content", [None])[0] for i in items]
    assert [i.type for i in items] == ["message"] * 5 and len({i.id for i in items}) == 5
    assert [getattr(t, "text", None) for t in texts[:2]] == ["Remember the word 'radix'.", ASK]
    assert [getattr(i, "role", None) for i in items] == ["user", "user", "assistant", "user", "assistant"]
    assert getattr(texts[2], "text", None) == first.output_text


def _text(item: Any) -> str:
    return str(item.to_dict()["content"][0]["text"])


async def test_items_paged_added_retrieved_deleted(sdk: AsyncOpenAI) -> None:
    conv = await sdk.conversations.create()
    assert conv.metadata == {}
    new: Any = [{"role": "user", "content": f"note {n}"} for n in range(5)]
    added = await sdk.conversations.items.create(conv.id, items=new)
    ids = [str(i.id) for i in added.data]
    assert len(added.data) == 5 and added.first_id == added.data[0].id
    page = await sdk.conversations.items.list(conv.id, limit=2)  # newest first by default
    assert [_text(i) for i in page.data] == ["note 4", "note 3"] and page.has_more
    every = [i.id async for i in sdk.conversations.items.list(conv.id, limit=2)]  # the SDK pages on
    assert every == ids[::-1]
    one = await sdk.conversations.items.retrieve(ids[1], conversation_id=conv.id)
    assert _text(one) == "note 1"
    after = await sdk.conversations.items.delete(ids[1], conversation_id=conv.id)
    assert after.id == conv.id
    with pytest.raises(openai.NotFoundError):
        await sdk.conversations.items.retrieve(ids[1], conversation_id=conv.id)
    updated = await sdk.conversations.update(conv.id, metadata={"k": "v"})
    assert updated.metadata == {"k": "v"} and (await sdk.conversations.retrieve(conv.id)).metadata == {
        "k": "v"
    }
    deleted = await sdk.conversations.delete(conv.id)
    assert deleted.deleted and deleted.id == conv.id and deleted.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError):
        await sdk.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model=MODEL, input="hi", conversation=conv.id)


async def test_conversation_errors(sdk: AsyncOpenAI) -> None:
    conv = await sdk.conversations.create()
    with pytest.raises(openai.BadRequestError) as too_many:
        await sdk.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}] * 21)
    assert too_many.value.body["param"] == "items"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        await sdk.conversations.items.create(conv.id, items=[{"type": "message", "content": "no role"}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError):
        await sdk.conversations.create(metadata={str(n): "v" for n in range(17)})
    with pytest.raises(openai.BadRequestError):
        await sdk.conversations.items.list(conv.id, limit=101)
    with pytest.raises(openai.NotFoundError):
        await sdk.conversations.items.list(conv.id, after="msg_nope")
    with pytest.raises(openai.BadRequestError):
        await sdk.responses.create(model=MODEL, input="x", conversation="not-a-conversation")
