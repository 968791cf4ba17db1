"""json_instances: every drawn value validates against its schema (checked by `jsonschema`), draws are
deterministic per seed and vary across seeds, and schemas it cannot honour are refused."""

from __future__ import annotations

import enum
import random
from typing import Any, Literal

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from emulator.json_instances import MAX_DEPTH, SHALLOW, SchemaError, any_object, instance

SEEDS = range(40)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str
    zip: int | None


class Person(BaseModel):
    name: str = Field(min_length=2, max_length=12)
    age: int = Field(ge=0, le=150)
    score: float = Field(gt=0, lt=1)
    tags: list[str] = Field(max_length=2)
    color: Color
    kind: Literal["a", "b"]
    home: Address
    past: list[Address]
    boss: Person | None
    active: bool


def _strict(schema: Any) -> Any:
    """What the SDKs send for strict structured output: every object closed, every property required."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out:
            out["additionalProperties"] = False
            out["required"] = list(out["properties"])
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


SCHEMAS: dict[str, Any] = {
    "pydantic strict (defs, refs, recursive anyOf null, enums, bounds)": _strict(Person.model_json_schema()),
    "pydantic as generated": Person.model_json_schema(),
    "formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f} for f in ("date-time", "date", "email", "uri", "uuid", "ipv4")
        },
        "required": ["date", "email", "ipv4"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "array",
        "prefixItems": [
            {"type": "integer", "minimum": 10, "maximum": 12},
            {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5},
            {"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 30},
            {"type": "number", "minimum": -1.5, "maximum": -1.25},
            {"type": "number", "exclusiveMaximum": 0},
        ],
        "items": False,
        "minItems": 5,
    },
    "arrays": {
        "type": "object",
        "properties": {
            "exact": {"type": "array", "items": {"type": "boolean"}, "minItems": 4, "maxItems": 4},
            "unique": {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "minItems": 3},
            "empty": {"type": "array", "maxItems": 0},
        },
        "required": ["exact", "unique", "empty"],
    },
    "allOf, oneOf, const, type lists, maps": {
        "allOf": [
            {"type": "object", "properties": {"a": {"const": 5}}, "required": ["a"]},
            {"properties": {"b": {"type": ["string", "null"]}}, "required": ["b"]},
        ],
        "properties": {
            "c": {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
        },
        "required": ["c", "m"],
    },
    "definitions and '#' refs": {
        "definitions": {"leaf": {"type": "string", "maxLength": 3}},
        "type": "object",
        "properties": {
            "l": {"$ref": "#/definitions/leaf"},
            "self": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        },
        "required": ["l", "self"],
    },
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_draw_is_valid(name: str) -> None:
    schema = SCHEMAS[name]
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for seed in SEEDS:
        value = instance(schema, random.Random(seed))
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (seed, value, errors)


def test_draws_are_deterministic_and_vary_with_the_seed() -> None:
    schema = SCHEMAS["pydantic strict (defs, refs, recursive anyOf null, enums, bounds)"]
    draws = [instance(schema, random.Random(seed)) for seed in SEEDS]
    assert draws == [instance(schema, random.Random(seed)) for seed in SEEDS]
    assert len({repr(d) for d in draws}) == len(draws)
    assert {d["boss"] is None for d in draws} == {True, False}  # the recursion is taken, and it ends
    assert 1 <= max(_chain(d) for d in draws) <= SHALLOW  # past SHALLOW levels: the cheapest branch
    assert {d["color"] for d in draws} == {"red", "green"}


def _chain(person: dict[str, Any]) -> int:
    """How many bosses above this person."""
    return 0 if person["boss"] is None else 1 + _chain(person["boss"])


def test_pydantic_parses_the_draws() -> None:
    schema = SCHEMAS["pydantic strict (defs, refs, recursive anyOf null, enums, bounds)"]
    for seed in SEEDS:
        Person.model_validate(instance(schema, random.Random(seed)))


def test_any_object_is_a_small_object() -> None:
    objects = [any_object(random.Random(seed)) for seed in SEEDS]
    assert all(isinstance(o, dict) and 1 <= len(o) <= 3 for o in objects)
    assert all(isinstance(v, str | int) for o in objects for v in o.values())


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "pattern": "^a+$"}, "'pattern'"),
        ({"not": {"type": "string"}}, "'not'"),
        ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, f"{MAX_DEPTH} levels"),
        ({"$ref": "#/$defs/missing"}, "points at nothing"),
        ({"$ref": "https://example.com/schema.json"}, "only local"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "bounds"),
        ({"enum": []}, "empty 'enum'"),
        (False, "must be an object"),
        ({"type": "array", "items": {"enum": [1]}, "uniqueItems": True, "minItems": 2}, "distinct"),
    ],
)
def test_schemas_without_a_buildable_instance_are_refused(schema: Any, words: str) -> None:
    with pytest.raises(SchemaError, match=words):
        instance(schema, random.Random(0))
