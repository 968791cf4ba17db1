"""Structured-output requests (SGLang's grammar-constrained decoding, contract §1.2, §2) → a JsonGrammar.

SGLang honours these through its grammar backend; the emulator models the JSON ones:

- chat and completions `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`
  (a JSON object), `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` (an instance of
  the schema); completions also take SGLang's `json_schema` (the schema as JSON text), /generate its
  `sampling_params.json_schema` (JSON text).
- `regex`, `ebnf` and `response_format` `structural_tag` are answered 400 ("not modelled"): an output
  that ignored them would look valid to nobody.

A constrained output (sampler.py) is the JSON text of one value drawn by json_instances.py with the
request's own seeded RNG, tokenized by the emulator's tokenizer, so token counts and the prompt + output
a follow-up turn re-sends stay consistent. It ends at the end of the JSON (finish_reason "stop", matched:
EOS) unless max tokens cut it first ("length"), as a constrained generation in SGLang does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from emulator.errors import ApiError, invalid
from emulator.json_instances import SchemaError, any_object, instance

UNMODELLED = ("regex", "ebnf")


@dataclass(frozen=True, slots=True, eq=False)
class JsonGrammar:
    """A JSON constraint: an instance of `schema`, or any JSON object when `schema` is None."""

    schema: Any = None

    def draw(self, rng: random.Random) -> str:
        """The constrained output's text; ApiError (400) if the schema has no instance we can build."""
        try:
            value = any_object(rng) if self.schema is None else instance(self.schema, rng)
        except SchemaError as exc:
            raise ApiError(f"Cannot generate a value for the JSON schema: {exc}") from exc
        return json.dumps(value, ensure_ascii=False)


def openai_grammar(body: Mapping[str, Any], model: str) -> JsonGrammar | None:
    """The constraint of a chat or completions request (`model` names the request type in errors)."""
    _reject_unmodelled(body)
    fmt = body.get("response_format")
    grammar = _from_response_format(fmt, model) if fmt is not None else None
    if grammar is None and body.get("json_schema") is not None:
        grammar = JsonGrammar(_schema_text(body["json_schema"]))
    return grammar


def generate_grammar(params: Mapping[str, Any]) -> JsonGrammar | None:
    """The constraint of a /generate request's sampling_params."""
    _reject_unmodelled(params)
    value = params.get("json_schema")
    return JsonGrammar(_schema_text(value)) if value is not None else None


def _reject_unmodelled(body: Mapping[str, Any]) -> None:
    for key in UNMODELLED:
        if body.get(key) is not None:
            raise ApiError(f"'{key}' constraints are not modelled by the emulator (only JSON ones are).")


def _from_response_format(fmt: Any, model: str) -> JsonGrammar | None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonGrammar()
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise invalid("response_format.json_schema", model, "Field required [type=missing]")
        schema = spec.get("schema", spec.get("schema_"))
        return JsonGrammar(_schema_text(schema) if isinstance(schema, str) else (schema or {}))
    if kind == "structural_tag":
        raise ApiError("'structural_tag' response formats are not modelled by the emulator.")
    detail = "Input should be 'text', 'json_object', 'json_schema' or 'structural_tag'"
    raise invalid("response_format.type", model, detail)


def _schema_text(value: Any) -> Any:
    """A schema given as JSON text (SGLang's `json_schema` fields) or already parsed."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ApiError(f"json_schema is not valid JSON: {exc}") from exc
