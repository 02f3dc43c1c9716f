"""The JSON Schema of ``python -m inspector compare --json``."""

from __future__ import annotations

from typing import Any

_NUMBER = {"anyOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}, {"type": "null"}]}
_FINDING = {"type": "object", "required": ["code", "severity", "where", "message"],
            "properties": {"code": {"type": "string"}, "severity": {"enum": ["error", "warning", "info"]},
                           "where": {"type": "string"}, "message": {"type": "string"}}}
_RECORDS = {"type": "array", "items": {"type": "object", "additionalProperties": {
    "anyOf": [_NUMBER, {"type": ["string", "boolean", "array"]}]}}}
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "python -m inspector compare --json",
    "type": "object",
    "required": ["a", "b", "facts", "findings", "modules"],
    "properties": {
        "a": {"type": "string"},
        "b": {"type": "string"},
        "facts": {"type": "object",
                  "additionalProperties": {"anyOf": [_NUMBER, {"type": ["string", "boolean"]}]}},
        "findings": {"type": "array", "items": _FINDING},
        "tensors": _RECORDS,
        "modules": _RECORDS,
        "steps": _RECORDS,
        "renamed": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
        "first_divergence": {"type": ["integer", "null"]},
        "first_modules": {"type": "array", "items": {"type": "string"}},
        "first_quantities": {"type": "array", "items": {"type": "string"}},
    },
}
"""The JSON Schema every ``compare --json`` file satisfies: numbers that are not finite are the strings
``"nan"``, ``"inf"``, ``"-inf"``; missing ones ``null``."""
