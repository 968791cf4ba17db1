"""Schema-valid JSON values drawn from a seeded RNG: the "model output" of structured-output requests.

SGLang constrains decoding with a grammar backend, so a `json_schema` request's output is an instance
of the schema and a `json_object` request's output is a JSON object. There is no model here:
`instance(schema, rng)` walks the schema once and draws every choice from `rng`, so the same request
(same seed) gets the same value. Keywords, in the order they are honoured at each level:

- `true` / `{}` accept anything (a short string is drawn); `false` has no instance (SchemaError).
- `$ref`: a local JSON pointer (`#`, `#/$defs/X`, `#/definitions/X`, ...) into the root schema.
- `allOf`: the branches merged into one schema (properties and required united); `anyOf` / `oneOf`: one
  branch (past depth SHALLOW the cheapest one: null, then scalars, then arrays, then objects and refs,
  which is what ends a recursive `anyOf [ {$ref}, null ]`); `const`; `enum`: one of the values.
- `type` (a list of types: one of them; absent: guessed from the other keywords):
  object: every declared property (past SHALLOW only the required ones), required names without a
  declaration from `additionalProperties`, extra keys only to reach `minProperties` and never when
  `additionalProperties` is false; array: `prefixItems`, then `items`, between `minItems` and
  `maxItems` (1-3 by default, `minItems` past SHALLOW), distinct with `uniqueItems`; string: a `format`
  (date-time, date, time, email, uri, uuid, ipv4, hostname) or 1-4 vocabulary words fitted to
  `minLength` / `maxLength`; integer / number: uniform within the (exclusive) bounds, 0-100 by default,
  on the `multipleOf` grid; boolean; null.

Keywords that cannot be honoured by construction (`pattern`, `patternProperties`, `not`, `if`,
`contains`, `propertyNames`, `dependentSchemas`) raise SchemaError, and so does a schema whose
recursion cannot end within MAX_DEPTH levels: the route answers 400 rather than emit an invalid value.
For `oneOf` the drawn branch is not checked against the others.
"""

from __future__ import annotations

import math
import random
from typing import Any

from emulator.words import WORDS

SHALLOW = 3
"""Nesting depth (objects, arrays, refs) up to which optional parts are drawn; deeper, the least is."""
MAX_DEPTH = 32
UNSUPPORTED = ("pattern", "patternProperties", "not", "if", "contains", "propertyNames", "dependentSchemas")
_SCALARS = ("string", "integer", "number", "boolean")
_FORMATS = ("date-time", "date", "time", "email", "uri", "url", "uuid", "ipv4", "hostname")


class SchemaError(ValueError):
    """The schema has no instance the emulator can build (the message names the keyword)."""


def instance(schema: Any, rng: random.Random) -> Any:
    """One value valid for ``schema`` (a JSON schema as parsed JSON), every choice drawn from ``rng``."""
    return _Walk(schema, rng).value(schema, 0)


def any_object(rng: random.Random) -> dict[str, Any]:
    """A small JSON object (json_object mode): 1-3 vocabulary keys with string, integer or boolean values."""
    keys = dict.fromkeys(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    schemas = [{"type": rng.choice(("string", "integer", "boolean"))} for _ in keys]
    return {k: _Walk({}, rng).value(s, 1) for k, s in zip(keys, schemas, strict=True)}


class _Walk:
    """One draw: the root (for $ref) and the RNG."""

    def __init__(self, root: Any, rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def value(self, schema: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SchemaError(f"the schema's recursion does not end within {MAX_DEPTH} levels")
        if schema is True or schema == {}:
            return self._words(1, 2)
        if not isinstance(schema, dict):
            raise SchemaError(f"a schema must be an object or a boolean, not {schema!r}")
        for key in UNSUPPORTED:
            if key in schema:
                raise SchemaError(f"the emulator cannot generate values for the '{key}' keyword")
        if "$ref" in schema:
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        if "allOf" in schema:
            return self.value(_merge(schema, [self._deref(s) for s in schema["allOf"]]), depth)
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            return self.value(self._branch(branches, depth), depth)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            if not schema["enum"]:
                raise SchemaError("an empty 'enum' has no value")
            return self.rng.choice(schema["enum"])
        return self._typed(schema, self._type(schema), depth)

    def _typed(self, schema: dict[str, Any], kind: str, depth: int) -> Any:
        if kind == "object":
            return self._object(schema, depth + 1)
        if kind == "array":
            return self._array(schema, depth + 1)
        if kind == "string":
            return self._string(schema)
        if kind in ("integer", "number"):
            return _number(schema, kind == "integer", self.rng)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        raise SchemaError(f"unknown type {kind!r}")

    def _type(self, schema: dict[str, Any]) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            return str(self.rng.choice(kind)) if kind else "null"
        if isinstance(kind, str):
            return kind
        if {"properties", "required", "additionalProperties"} & schema.keys():
            return "object"
        if {"items", "prefixItems"} & schema.keys():
            return "array"
        return "string"

    def _branch(self, branches: list[Any], depth: int) -> Any:
        options = [self._deref(b) for b in branches]
        if depth <= SHALLOW:
            return self.rng.choice(options)
        return min(options, key=_cost)

    def _deref(self, schema: Any) -> Any:
        """Follow a bare `$ref` (so branch costs and merges see the target); other schemas as they are."""
        seen = 0
        while isinstance(schema, dict) and set(schema) == {"$ref"} and seen < MAX_DEPTH:
            schema, seen = self._resolve(schema["$ref"]), seen + 1
        return schema

    def _resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"only local '$ref's ('#/...') can be resolved, not {ref!r}")
        node = self.root
        for raw in filter(None, ref[1:].split("/")):
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"'$ref' {ref!r} points at nothing")
        return node

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        required = [str(r) for r in schema.get("required") or []]
        extra = schema.get("additionalProperties", True)
        names = list(props) if depth <= SHALLOW else [p for p in props if p in required]
        names += [r for r in required if r not in names]
        if extra is not False:
            wanted = int(schema.get("minProperties", 0))
            if not props and isinstance(extra, dict) and depth <= SHALLOW:
                wanted = max(wanted, self.rng.randint(1, 2))
            names += [f"{WORDS[i % len(WORDS)]}_{i}" for i in range(max(0, wanted - len(names)))]
        limit = schema.get("maxProperties")
        if isinstance(limit, int) and len(names) > limit:
            room = max(0, limit - sum(n in required for n in names))
            optional = [n for n in names if n not in required][:room]
            names = [n for n in names if n in required or n in optional]
        fallback = extra if isinstance(extra, dict) else {}
        return {name: self.value(props.get(name, fallback), depth) for name in names}

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", True)
        lo = max(int(schema.get("minItems", 0)), 0)
        hi = int(schema.get("maxItems", lo + 3))
        if items is False:
            hi = min(hi, len(prefix))
        if hi < lo:
            raise SchemaError("'minItems' exceeds what 'maxItems' (or the prefixItems) allow")
        count = lo if depth > SHALLOW else self.rng.randint(min(max(lo, 1), hi), min(hi, max(lo, 1) + 2))
        out: list[Any] = []
        for _ in range(count * 8):
            if len(out) == count:
                break
            value = self.value(prefix[len(out)] if len(out) < len(prefix) else items, depth)
            if not schema.get("uniqueItems") or value not in out:
                out.append(value)
        if len(out) < lo:
            raise SchemaError("too few distinct values for 'minItems' with 'uniqueItems'")
        return out

    def _string(self, schema: dict[str, Any]) -> str:
        fmt = schema.get("format")
        if fmt in _FORMATS:
            return _formatted(str(fmt), self.rng)
        lo = max(int(schema.get("minLength", 0)), 0)
        hi = schema.get("maxLength")
        text = self._words(1, 4)
        while len(text) < lo:
            text += " " + self.rng.choice(WORDS)
        return text[: int(hi)] if hi is not None else text

    def _words(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(lo, hi)))


def _merge(schema: dict[str, Any], parts: list[Any]) -> dict[str, Any]:
    """allOf: the schema without it, then each branch; properties and required are united."""
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for part in parts:
        if part is True:
            continue
        if not isinstance(part, dict):
            raise SchemaError("an 'allOf' branch is false or not a schema")
        props = {**merged.get("properties", {}), **part.get("properties", {})}
        required = [*merged.get("required", []), *part.get("required", [])]
        merged |= part
        if props:
            merged["properties"] = props
        if required:
            merged["required"] = list(dict.fromkeys(required))
    return merged


def _cost(schema: Any) -> int:
    """How soon a branch ends: null 0, scalars and enums 1, arrays 2, objects and anything else 3."""
    if not isinstance(schema, dict):
        return 3
    kind = schema.get("type")
    if kind == "null":
        return 0
    if kind in _SCALARS or "enum" in schema or "const" in schema:
        return 1
    return 2 if kind == "array" else 3


def _number(schema: dict[str, Any], integer: bool, rng: random.Random) -> int | float:
    lo, hi = _bounds(schema, integer)
    step = schema.get("multipleOf")
    if step:
        k_lo, k_hi = math.ceil(lo / step), math.floor(hi / step)
        if k_lo > k_hi:
            raise SchemaError("no multiple of 'multipleOf' lies within the bounds")
        value = rng.randint(k_lo, k_hi) * step
        return int(value) if integer else value
    if integer:
        if math.ceil(lo) > math.floor(hi):
            raise SchemaError("no integer lies within the bounds")
        return rng.randint(math.ceil(lo), math.floor(hi))
    value = round(rng.uniform(lo, hi), 2)
    return value if lo <= value <= hi else (lo + hi) / 2


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    """[lo, hi] from minimum / maximum / exclusive bounds (draft 4 booleans too); 0-100 by default."""
    eps = 1 if integer else 0.01
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if xlo is True and lo is not None:
        lo, xlo = None, lo
    if xhi is True and hi is not None:
        hi, xhi = None, hi
    if isinstance(xlo, int | float) and not isinstance(xlo, bool):
        lo = max(lo, xlo + eps) if lo is not None else xlo + eps
    if isinstance(xhi, int | float) and not isinstance(xhi, bool):
        hi = min(hi, xhi - eps) if hi is not None else xhi - eps
    if lo is None:
        lo = 0 if hi is None else hi - 100
    if hi is None:
        hi = lo + 100
    if lo > hi:
        raise SchemaError("the schema's bounds leave no number")
    return lo, hi


def _formatted(fmt: str, rng: random.Random) -> str:
    day = f"{rng.randint(2020, 2026)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
    word = rng.choice(WORDS)
    by_format = {
        "date-time": f"{day}T{clock}Z",
        "date": day,
        "time": f"{clock}Z",
        "email": f"{word}@example.com",
        "uri": f"https://example.com/{word}",
        "url": f"https://example.com/{word}",
        "uuid": _uuid(rng),
        "ipv4": ".".join(str(rng.randint(1, 254)) for _ in range(4)),
        "hostname": f"{word}.example.com",
    }
    return by_format[fmt]


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"
