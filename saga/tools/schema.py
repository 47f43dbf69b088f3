"""A small, template-aware checker for JSON-schema-like parameter schemas.

Tools describe their parameters with the common subset of JSON Schema: ``type`` (a name
or a list of names), ``properties``, ``required``, ``additionalProperties`` (a boolean or
a schema), ``items``, ``enum``, ``const``, ``anyOf`` / ``oneOf`` / ``allOf``, local
``$ref`` (``#/$defs/...`` or ``#/definitions/...``), ``minimum`` / ``maximum``,
``minLength`` / ``maxLength`` and ``minItems`` / ``maxItems``. Other keywords are ignored.

Parameters are checked before a run starts, when they may still hold ``{{ ... }}``
templates: a template string is "unknown until run time" and is accepted wherever a
value is expected, and a templated key is accepted as any property.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list | tuple),
    "object": lambda v: isinstance(v, dict),
}


def is_template(value: Any) -> bool:
    """Whether ``value`` is a string holding template markers (rendered only at run time)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def json_type(value: Any) -> str:
    """The JSON type name of a Python value (``integer``, ``string``, ``object``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def check(schema: dict[str, Any] | None, value: Any) -> list[str]:
    """Every way ``value`` breaks ``schema``, as readable messages (empty when it fits).

    Messages about the top level read ``missing required parameter 'x'``; deeper ones
    start with the path of the value, e.g. ``argv[1]: expected string, got integer``.
    """
    if not schema:
        return []
    return _Checker(schema).check(schema, value, "")


class _Checker:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while "$ref" in schema and seen < 32:
            ref = schema["$ref"]
            target: Any = self.root
            if not isinstance(ref, str) or not ref.startswith("#"):
                return {}
            for part in ref.lstrip("#").strip("/").split("/"):
                if not part:
                    continue
                target = target.get(part, {}) if isinstance(target, dict) else {}
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            seen += 1
        return schema

    def check(self, schema: Any, value: Any, path: str) -> list[str]:
        if not isinstance(schema, dict) or is_template(value):
            return []
        schema = self.resolve(schema)
        where = f"{path}: " if path else ""
        for keyword in ("anyOf", "oneOf"):
            options = schema.get(keyword)
            if isinstance(options, list) and options and not any(
                    not self.check(option, value, path) for option in options):
                return [f"{where}{_value_text(value)} matches none of the allowed forms"]
        problems: list[str] = []
        for option in schema.get("allOf") or []:
            problems += self.check(option, value, path)
        expected = schema.get("type")
        if expected is not None:
            names = expected if isinstance(expected, list) else [expected]
            if not any(_TYPES.get(name, lambda v: True)(value) for name in names):
                wanted = " or ".join(str(n) for n in names)
                return [*problems, f"{where}expected {wanted}, got {json_type(value)}"]
        if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
            allowed = ", ".join(repr(v) for v in schema["enum"])
            problems.append(f"{where}{_value_text(value)} is not one of {allowed}")
        if "const" in schema and value != schema["const"]:
            problems.append(f"{where}must be {schema['const']!r}")
        if isinstance(value, dict):
            problems += self._object(schema, value, path)
        elif isinstance(value, list | tuple):
            problems += self._array(schema, value, path)
        elif isinstance(value, str):
            problems += _bounds(where, len(value), schema, "minLength", "maxLength", "characters")
        elif _TYPES["number"](value):
            if "minimum" in schema and value < schema["minimum"]:
                problems.append(f"{where}must be at least {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                problems.append(f"{where}must be at most {schema['maximum']}")
        return problems

    def _object(self, schema: dict[str, Any], value: dict[Any, Any], path: str) -> list[str]:
        problems: list[str] = []
        properties = schema.get("properties") or {}
        templated_keys = any(is_template(k) for k in value)
        noun = "parameter" if not path else "key"
        where = f"{path}: " if path else ""
        if not templated_keys:
            for name in schema.get("required") or []:
                if name not in value:
                    problems.append(f"{where}missing required {noun} {name!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key in properties:
                problems += self.check(properties[key], item, sub)
            elif is_template(key):
                continue
            elif extra is False:
                known = ", ".join(sorted(properties)) or "none"
                problems.append(f"{where}unknown {noun} {key!r} (expected: {known})")
            elif isinstance(extra, dict):
                problems += self.check(extra, item, sub)
        return problems

    def _array(self, schema: dict[str, Any], value: list[Any] | tuple[Any, ...],
               path: str) -> list[str]:
        where = f"{path}: " if path else ""
        problems = _bounds(where, len(value), schema, "minItems", "maxItems", "items")
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                problems += self.check(items, item, f"{path}[{i}]")
        return problems


def _bounds(where: str, size: int, schema: dict[str, Any], low: str, high: str,
            unit: str) -> list[str]:
    if low in schema and size < schema[low]:
        return [f"{where}needs at least {schema[low]} {unit}"]
    if high in schema and size > schema[high]:
        return [f"{where}allows at most {schema[high]} {unit}"]
    return []


def _value_text(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
