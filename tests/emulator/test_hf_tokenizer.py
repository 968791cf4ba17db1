"""``--emu-tokenizer hf``: the emulator tokenizes with a real tokenizer directory (emulator/model_bpe) as
SGLang does, so a gateway holding the same files computes the very token ids (and block keys) the
replica caches. Expected ids are computed here by direct jinja2 + ``tokenizers`` calls, independently of
emulator/chat_template.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from tokenizers import Tokenizer

from emulator.config import parse_args
from emulator.errors import ApiError
from emulator.hf_tokenizer import HfTokenizer, SegmentEncoder
from emulator.replica import Replica
from emulator.tokenizer import PseudoTokenizer
from routing.hashing import token_block_hashes
from tests.emulator.conftest import StartEmu
from tests.emulator.sdk import streamed_chat
from tests.emulator.test_kv_events import Zmq, events_flag, stored, sync, zq

__all__ = ["zq"]  # the ZMQ fixture of test_kv_events, used here too

BPE = Path(__file__).resolve().parents[2] / "emulator" / "model_bpe"
HF = ("--emu-tokenizer", "hf", "--model-path", str(BPE), "--emu-time-scale", "0.001", "--enable-cache-report")
TOK = Tokenizer.from_file(str(BPE / "tokenizer.json"))
CONFIG = json.loads((BPE / "tokenizer_config.json").read_text())
SYSTEM = {"role": "system", "content": "You are a terse assistant that answers in short words."}
USER = {"role": "user", "content": "Tell me about the cache of the router, the pages and the blocks, please."}
SDK_MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": USER["content"]}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def render(messages: list[dict[str, Any]], tools: list[Any] | None = None, gen: bool = True) -> str:
    """HF transformers' render, written out: sandboxed env, tojson, raise_exception, special tokens."""

    def fail(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    env.globals["raise_exception"] = fail
    specials = {k: CONFIG[k] for k in ("eos_token", "pad_token", "additional_special_tokens")}
    template = env.from_string(CONFIG["chat_template"])
    return template.render(messages=messages, tools=tools, add_generation_prompt=gen, **specials)


def ids_of(text: str) -> list[int]:
    return list(TOK.encode(text, add_special_tokens=False).ids)


def tokenizer_dir(tmp_path: Path, template: str) -> Path:
    shutil.copy(BPE / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**CONFIG, "chat_template": template}))
    return tmp_path


def test_chat_ids_are_the_direct_jinja2_and_tokenizers_result() -> None:
    hf = HfTokenizer(BPE)
    msgs = [SYSTEM, USER]
    assert hf.chat_ids(msgs, None, {}) == ids_of(render(msgs))
    assert hf.decode(hf.chat_ids(msgs, None, {})) == render(msgs)
    # tools reach the template as SGLang passes them: each function with pydantic's defaults
    function = {"description": None, "name": "lookup", "parameters": {"type": "object"}, "strict": False}
    assert hf.chat_ids(msgs, [TOOL], {}) == ids_of(render(msgs, [function]))
    assert hf.chat_ids(msgs, [TOOL], {"tool_choice": "none"}) == ids_of(render(msgs))
    assert hf.encode("plain text 42") == list(TOK.encode("plain text 42").ids)


def test_continue_final_message_appends_the_prefix_tokens() -> None:
    hf = HfTokenizer(BPE)
    prefix = {"role": "assistant", "content": "The cache holds"}
    ids = hf.chat_ids([USER, prefix], None, {"continue_final_message": True})
    assert ids == ids_of(render([USER])) + list(TOK.encode("The cache holds").ids)
    full = render([USER, prefix], gen=False)  # HF's continue_final_message text: cut after the content
    assert hf.decode(ids) == full[: full.rindex("The cache holds") + len("The cache holds")]
    as_user = {"role": "user", "content": "The cache holds"}  # SGLang: without it, a final turn is the user's
    assert hf.chat_ids([USER, prefix], None, {}) == ids_of(render([USER, as_user]))


def test_list_content_with_a_string_template_keeps_only_the_text() -> None:
    hf = HfTokenizer(BPE)
    assert hf.template is not None and hf.template.content_format == "string"
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    msg = {"role": "user", "content": [*parts, {"type": "text", "text": "here"}]}
    assert hf.chat_ids([msg], None, {}) == ids_of(render([{"role": "user", "content": "look here"}]))


def test_openai_format_template_sees_normalized_parts(tmp_path: Path) -> None:
    template = (
        "{% for message in messages %}{% for p in message['content'] %}[{{ p.type }}]{% endfor %}{% endfor %}"
    )
    hf = HfTokenizer(tokenizer_dir(tmp_path, template))
    assert hf.template is not None and hf.template.content_format == "openai"
    msg = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}
    assert hf.decode(hf.chat_ids([msg], None, {})) == "[text][image]"


def test_a_template_error_is_a_400(tmp_path: Path) -> None:
    hf = HfTokenizer(tokenizer_dir(tmp_path, "{{ raise_exception('System role not supported') }}"))
    with pytest.raises(ApiError) as err:
        hf.chat_ids([SYSTEM, USER], None, {})
    assert err.value.status == 400 and err.value.message == "System role not supported"


TRICKY = (
    "a <|im_end|> b",
    "\n\n<|im_start|>user\n\n\nx  <|im_end|>\n",
    "<|im_start|><|im_end|>  \t<|endoftext|>x",
    "caf\u00e9<tool_call>\n{}\n</tool_call> 12345 !!",
    "",
)


def test_piecewise_encoding_is_the_whole_text_encoding(tmp_path: Path) -> None:
    pieces = SegmentEncoder(TOK, budget=12)
    assert pieces.exact
    for text in (*TRICKY, render([SYSTEM, USER]), *TRICKY):
        assert pieces.encode(text) == ids_of(text), text
    assert pieces.cached <= 12 or len(pieces.cache) == 1  # the LRU stays within its token budget
    doc = json.loads((BPE / "tokenizer.json").read_text())
    doc["added_tokens"][1]["lstrip"] = True  # <|im_start|> eats the blanks before it: no piecewise path
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    stripping = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    fallback = SegmentEncoder(stripping)
    assert not fallback.exact
    assert [fallback.encode(t) for t in TRICKY] == [
        stripping.encode(t, add_special_tokens=False).ids for t in TRICKY
    ]


def test_token_texts_concatenate_to_the_decoded_text() -> None:
    hf = HfTokenizer(BPE)
    text = "caf\u00e9 \u2615 and \U0001f600 plain"
    ids = hf.encode(text)
    texts = hf.token_texts(ids)
    assert len(texts) == len(ids) and "".join(texts) == text and "\ufffd" not in "".join(texts)
    assert "".join(hf.token_texts(ids[:3])) == hf.decode(ids[:3])  # a cut inside a character


def test_pseudo_stays_the_default() -> None:
    cfg = parse_args([])
    assert cfg.emu_tokenizer == "pseudo"
    assert isinstance(Replica.build(cfg, 30000).tokenizer, PseudoTokenizer)
    assert isinstance(Replica.build(parse_args(list(HF)), 30000).tokenizer, HfTokenizer)
    with pytest.raises(SystemExit):
        parse_args(["--emu-tokenizer", "hf", "--tokenizer-path", str(BPE.parent)])  # no tokenizer.json


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_prompt_tokens_are_the_hf_counts(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*HF)
    chat = await post(http, emu.url + "/v1/chat/completions", {"messages": [SYSTEM, USER], "max_tokens": 3})
    assert chat["usage"]["prompt_tokens"] == len(ids_of(render([SYSTEM, USER])))
    text = "The pages of the cache, one after the other."
    comp = await post(http, emu.url + "/v1/completions", {"prompt": text, "max_tokens": 2})
    assert comp["usage"]["prompt_tokens"] == len(TOK.encode(text).ids)
    ids = list(range(100, 137))
    comp = await post(http, emu.url + "/v1/completions", {"prompt": ids, "max_tokens": 2, "echo": True})
    assert comp["usage"]["prompt_tokens"] == 37 and comp["choices"][0]["text"].startswith(TOK.decode(ids))
    gen = await post(http, emu.url + "/generate", {"text": text, "sampling_params": {"max_new_tokens": 2}})
    assert gen["meta_info"]["prompt_tokens"] == len(TOK.encode(text).ids)
    assert gen["output_ids"] == list(TOK.encode(gen["text"]).ids)  # the output text round-trips
    tokenized = await post(http, emu.url + "/tokenize", {"prompt": text})
    assert tokenized["tokens"] == list(TOK.encode(text).ids)
    async with http.get(emu.url + "/get_server_info") as resp:
        info = await resp.json()
    assert info["tokenizer_path"] == info["model_path"] == str(BPE)


async def test_structured_output_with_non_ascii_text(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*HF)
    schema = {
        "type": "object",
        "properties": {"drink": {"enum": ["caf\u00e9 \u2615"]}},
        "required": ["drink"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "d", "schema": schema}}
    body = {"messages": [USER], "response_format": fmt, "stream": True}
    async with http.post(emu.url + "/v1/chat/completions", json=body) as resp:
        lines = [ln async for ln in resp.content if ln.startswith(b"data: {")]
    chunks = [json.loads(ln[6:]) for ln in lines]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert json.loads(content) == {"drink": "caf\u00e9 \u2615"}


async def test_a_growing_conversation_hits_its_earlier_turn(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*HF)
    turn1 = [SYSTEM, USER]
    first = await post(http, emu.url + "/v1/chat/completions", {"messages": turn1, "max_tokens": 12})
    answer = first["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
    second = await post(http, emu.url + "/v1/chat/completions", {"messages": turn2, "max_tokens": 4})
    p1, p2 = ids_of(render(turn1)), ids_of(render(turn2))
    out = list(TOK.encode(answer).ids)
    assert len(out) == first["usage"]["completion_tokens"] == 12
    assert p2[: len(p1) + len(out)] == p1 + out  # the re-sent answer re-encodes to the sampled ids
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert len(p1) + len(out) - 1 <= cached <= len(p1) + len(out)  # turn 1 with its answer


async def test_openai_sdk_against_an_hf_emulator(emulator: StartEmu) -> None:
    emu = await emulator(*HF)
    async with AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="none", max_retries=0) as client:
        chat = await client.chat.completions.create(model="m", messages=SDK_MSGS, max_tokens=5)
        assert chat.usage is not None and chat.usage.prompt_tokens == len(ids_of(render([USER])))
        assert chat.usage.completion_tokens == len(TOK.encode(chat.choices[0].message.content or "").ids) == 5
        text, usage = await streamed_chat(client, SDK_MSGS, 5)
        assert text == chat.choices[0].message.content and usage is not None
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


async def test_kv_event_pages_key_like_the_gateway(emulator: StartEmu, zq: Zmq) -> None:
    """The events' token ids are the hf ids: chaining their pages with token_block_hashes gives the keys a
    gateway computes from the request's tokenizers-encoded chat text."""
    sub = zq.sub()
    emu = await emulator(*HF, "--page-size", "16", *events_flag(sub))
    start = await sync(emu, sub)
    msgs = [SYSTEM, USER, {"role": "user", "content": "More words to fill one more page of tokens here."}]
    chat = await post(emu.http, emu.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    want = token_block_hashes("m", ids_of(render(msgs)), "", 16, 1 << 10)
    assert len(want) >= 3 and chat["usage"]["prompt_tokens"] == len(ids_of(render(msgs)))
    await sub.until(lambda: len(stored(sub.events(start))) >= len(want))
    keys: dict[int | None, int | None] = {None: None}
    for block in stored(sub.events(start)):
        seed = keys[block.parent_block_hash]
        (keys[block.block_hashes[0]],) = token_block_hashes("m", block.token_ids, "", 16, 1, seed=seed)
    chained = [keys[b.block_hashes[0]] for b in stored(sub.events(start))]
    assert chained[: len(want)] == list(want)
