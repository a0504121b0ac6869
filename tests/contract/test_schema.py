"""The config's JSON schema (resources/config.schema.json) is what the app builds its forms from."""
from __future__ import annotations

import json

from dmad.contract.config import SCHEMA_PATH, json_schema

REGENERATE = "resources/config.schema.json is out of date: run `python -m dmad.contract.config` and commit the result"


def _leaves(schema: dict):
    """(dotted name, property schema) of every config field that is not a group ($ref)."""
    for key, prop in schema["properties"].items():
        if "$ref" not in prop:
            yield key, prop
    for group, sub in schema.get("$defs", {}).items():
        for key, prop in sub.get("properties", {}).items():
            if "$ref" not in prop:
                yield f"{group}.{key}", prop


def test_exported_schema_matches_the_code():
    assert SCHEMA_PATH.is_file(), REGENERATE
    assert json.loads(SCHEMA_PATH.read_text(encoding="utf-8")) == json_schema(), REGENERATE


def test_every_field_has_a_description():
    missing = [name for name, prop in _leaves(json_schema()) if not prop.get("description", "").strip()]
    assert not missing, f"fields without a description (the app's tooltips): {missing}"


def test_every_number_has_a_range():
    """The app validates forms as the user types from these bounds."""
    unbounded = []
    for name, prop in _leaves(json_schema()):
        for t in [prop, *prop.get("anyOf", [])]:
            t = t.get("items", t) if t.get("type") == "array" else t
            if t.get("type") in ("integer", "number"):
                lo = "minimum" in t or "exclusiveMinimum" in t
                hi = "maximum" in t or "exclusiveMaximum" in t
                if not (lo and hi):
                    unbounded.append(name)
    assert not unbounded, f"numeric fields without a lower and upper bound: {unbounded}"


def test_every_group_is_described():
    schema = json_schema()
    assert {"Identity", "Resources", "Optimization", "Distillation", "Observation"} <= set(schema["$defs"])
    for group, sub in schema["$defs"].items():
        assert sub.get("description"), group
        assert sub.get("additionalProperties") is False, f"{group} must reject unknown keys"
