"""The functions under the Config panel's document (app/models/document.py), without Qt: the form's
layout read from the engine's JSON schema, the raw config dict checked with the engine's own rules,
its JSON text, and its relative paths kept meaningful when the config moves (save as, materialize).

The raw dict is the source of truth: the form and the JSON view both edit it, and it keeps whatever
the user wrote (sparse keys, unknown keys, wrong types) so that the engine, not the app, judges it.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from dmad.contract.config import PATH_FIELDS, TrainConfig, format_validation_error, json_schema, migrate, validate_config
from dmad.errors import UserInputError
from dmad.contract.jsonfile import no_duplicate_keys, read_json_file

Key = tuple[str, ...]  # ("resources", "train_batch_size"); top-level fields: ("config_version",)


@dataclass(frozen=True)
class FieldSpec:
    key: Key
    kind: str                  # bool | int | float | enum | str | list
    description: str
    default: Any               # the schema default; None for required fields
    required: bool
    nullable: bool             # null is a valid value (shown as an explicit "none" option)
    options: tuple = ()        # enum values
    item_kind: str = ""        # list items: int | float | str | object (identity.teacher_loras: {path, scale})
    range_text: str = ""       # "range (0, 1]", "1-200 characters" ...

    @property
    def name(self) -> str:
        return self.key[-1]


@dataclass(frozen=True)
class GroupSpec:
    name: str                  # "" for the top-level fields (config_version)
    description: str
    fields: tuple[FieldSpec, ...]


def _num(v: Any) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def _interval(s: dict) -> str:
    """'[1, 4096]', '(0, 1]', '[0, inf)' from minimum/maximum/exclusiveMinimum/exclusiveMaximum."""
    lo = s.get("exclusiveMinimum", s.get("minimum"))
    hi = s.get("exclusiveMaximum", s.get("maximum"))
    if lo is None and hi is None:
        return ""
    left = "(" if lo is None or "exclusiveMinimum" in s else "["
    right = ")" if hi is None or "exclusiveMaximum" in s else "]"
    return f"{left}{'-inf' if lo is None else _num(lo)}, {'inf' if hi is None else _num(hi)}{right}"


def _range_text(main: dict, kind: str) -> str:
    if kind in ("int", "float"):
        interval = _interval(main)
        return f"range {interval}" if interval else ""
    if kind == "str" and ("minLength" in main or "maxLength" in main):
        text = f"{main.get('minLength', 0)}-{main['maxLength']} characters" if "maxLength" in main \
            else f"at least {main['minLength']} character(s)"
        return text + (f", pattern {main['pattern']}" if "pattern" in main else "")
    if kind == "list":
        items = _interval(main.get("items", {}))
        count = f"{main.get('minItems', 0)}-{main.get('maxItems', 'any')} items"
        return count + (f", each in {items}" if items else "")
    return ""


_KINDS = {"boolean": "bool", "integer": "int", "number": "float", "string": "str", "array": "list"}


def field_spec(key: Key, prop: dict, required: bool) -> FieldSpec:
    """One schema property -> how the form edits it. Optional[X] is anyOf [X, null]."""
    variants = prop.get("anyOf", [prop])
    main = next(v for v in variants if v.get("type") != "null")
    options = tuple(main["enum"]) if "enum" in main else ((main["const"],) if "const" in main else ())
    kind = "enum" if options else _KINDS[main["type"]]
    items = main.get("items", {})
    item_kind = ("object" if "$ref" in items else _KINDS.get(items.get("type", ""), "str")) if kind == "list" else ""
    return FieldSpec(key=key, kind=kind, description=prop.get("description", ""), default=prop.get("default"),
                     required=required, nullable=any(v.get("type") == "null" for v in variants),
                     options=options, item_kind=item_kind, range_text=_range_text(main, kind))


def form_spec(schema: Optional[dict] = None) -> tuple[GroupSpec, ...]:
    """The groups in schema order (identity, resources, optimization, distillation, observation),
    each with its fields in declaration order; top-level scalars come first as group ""."""
    schema = schema or json_schema()
    defs, groups, top = schema.get("$defs", {}), [], []
    for name, prop in schema["properties"].items():
        ref = prop.get("$ref", "")
        if not ref:
            top.append(field_spec((name,), prop, name in schema.get("required", [])))
            continue
        groups += _groups((name,), defs[ref.rsplit("/", 1)[-1]], defs)
    return (GroupSpec("", "The config file itself.", tuple(top)), *groups)


def _sub_model(prop: dict, defs: dict) -> Optional[dict]:
    """The model a property holds when it is a group of its own ($ref, allOf [$ref], Optional[group])."""
    refs = [v.get("$ref", "") for v in [prop, *prop.get("allOf", []), *prop.get("anyOf", [])]]
    ref = next((r for r in refs if r), "")
    sub = defs.get(ref.rsplit("/", 1)[-1]) if ref else None
    return sub if isinstance(sub, dict) and sub.get("properties") else None


def _groups(key: Key, sub: dict, defs: dict) -> list[GroupSpec]:
    """A group's fields, then each group nested in it (observation.health) as a group of its own,
    "observation.health", whose fields are keyed ("observation", "health", "alerts")."""
    fields, nested = [], []
    for f, p in sub["properties"].items():
        inner = _sub_model(p, defs)
        if inner is not None:
            nested += _groups(key + (f,), {**inner, "description": inner.get("description") or
                                           p.get("description", "")}, defs)
        else:
            fields.append(field_spec(key + (f,), p, f in sub.get("required", [])))
    return [GroupSpec(".".join(key), sub.get("description", ""), tuple(fields)), *nested]


def all_fields(spec: tuple[GroupSpec, ...]) -> dict[Key, FieldSpec]:
    return {f.key: f for g in spec for f in g.fields}


# --------------------------------------------------------------------------- validation

@dataclass(frozen=True)
class Problems:
    message: str = ""                                   # the engine's one line for the first problem
    fields: dict[Key, str] = field(default_factory=dict)  # a message per field that has a problem
    general: tuple[str, ...] = ()                        # problems naming no single field

    @property
    def valid(self) -> bool:
        return not self.message


class _OneError:
    """Duck-types a ValidationError holding one of its errors, so format_validation_error (which
    reads only .errors()) words every problem exactly as the engine words the first."""

    def __init__(self, err: dict):
        self._err = err

    def errors(self) -> list[dict]:
        return [self._err]


def _field_of(loc: tuple, known: dict[Key, FieldSpec]) -> Optional[Key]:
    for n in (1, 2, 3):  # ("config_version",), ("group", "field", <list index>...), ("group", "sub", "field")
        key = tuple(str(p) for p in loc[:n])
        if len(loc) >= n and key in known:
            return key
    return None


def check(raw: Any, source: str, known: dict[Key, FieldSpec]) -> Problems:
    """What `dmad train --config` would say about `raw` before touching any file (paths are checked
    in preflight), as the engine's own one-line messages."""
    if not isinstance(raw, dict):
        return Problems(f"{source}: the config must be a JSON object, got {type(raw).__name__}")
    try:
        raw = migrate(raw)
    except UserInputError as e:
        return Problems(str(e), {("config_version",): str(e)})
    try:
        TrainConfig.model_validate(raw)
    except ValidationError as e:
        fields: dict[Key, str] = {}
        general: list[str] = []
        for err in e.errors():
            one = format_validation_error(_OneError(err), source)  # type: ignore[arg-type]
            key = _field_of(tuple(err["loc"]), known)
            if key is None:
                general.append(one)
            else:
                fields.setdefault(key, one)
        return Problems(format_validation_error(e, source), fields, tuple(general))
    return Problems()


# --------------------------------------------------------------------------- JSON text

class JsonTextError(ValueError):
    """The JSON view's text does not parse; the message is one line with line and column."""


def parse_json_text(text: str) -> Any:
    """json.loads with the engine's duplicate-key rule (dmad.contract.jsonfile)."""
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise JsonTextError(f"line {e.lineno}, column {e.colno}: {e.msg}") from None
    except ValueError as e:  # a duplicate key
        raise JsonTextError(str(e)) from None
    except RecursionError:  # thousands of nested brackets typed or pasted into the raw JSON
        raise JsonTextError("nested too deeply") from None


def ordered(raw: dict, spec: tuple[GroupSpec, ...]) -> dict:
    """Schema order (so the text does not depend on the order fields were edited in); keys the
    schema does not know keep their place after the known ones, for the engine to reject."""
    known_top = [f.key[0] for f in spec[0].fields] + [g.name for g in spec[1:]]
    out = {k: raw[k] for k in known_top if k in raw} | {k: v for k, v in raw.items() if k not in known_top}
    for g in spec[1:]:
        sub = out.get(g.name)
        if isinstance(sub, dict):
            names = [f.name for f in g.fields]
            out[g.name] = {k: sub[k] for k in names if k in sub} | {k: v for k, v in sub.items() if k not in names}
    return out


def to_json_text(raw: dict, spec: tuple[GroupSpec, ...]) -> str:
    return json.dumps(ordered(raw, spec), indent=2, ensure_ascii=False) + "\n"


UNSET = object()  # a form value meaning "remove the key": the engine's default applies


def with_field(raw: dict, key: Key, value: Any) -> dict:
    """A copy of `raw` with `key` set to `value` (UNSET removes it); a missing group is created."""
    out = copy.deepcopy(raw)
    node = out
    for part in key[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if value is UNSET:
        node.pop(key[-1], None)
    else:
        node[key[-1]] = value
    return out


def get_field(raw: dict, key: Key) -> Any:
    """The value at `key`, or UNSET when absent."""
    node: Any = raw
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return UNSET
        node = node[part]
    return node


# --------------------------------------------------------------------------- paths

LORAS_KEY: Key = ("identity", "teacher_loras")  # a list whose entries hold a path each


def _relative_paths(raw: dict):
    """(key, value, path) for the path fields that hold a relative path (resolve_paths' rule:
    '~' is expanded, 'latest' is not a path)."""
    for key in PATH_FIELDS:
        value = get_field(raw, key)
        if isinstance(value, str) and value and value != "latest" and not Path(value).expanduser().is_absolute():
            yield key, value, Path(value)
    loras = get_field(raw, LORAS_KEY)
    for i, entry in enumerate(loras if isinstance(loras, list) else []):
        value = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            yield (*LORAS_KEY, i, "path"), value, Path(value)


def rebase_paths(raw: dict, old_base: Path, new_base: Path) -> dict:
    """The same config for a file in `new_base`: relative paths that pointed into or below the new
    folder become relative to it, others absolute (a '../../..' chain is harder to read than the
    path itself, and breaks when only the config moves)."""
    if old_base.resolve() == new_base.resolve():
        return copy.deepcopy(raw)
    out = raw
    for key, _, path in _relative_paths(raw):
        target = (old_base / path).resolve()
        try:
            rel = Path(os.path.relpath(target, new_base.resolve()))
        except ValueError:  # another drive (Windows)
            rel = Path("..")
        new = str(target) if rel.parts[:1] == ("..",) else rel.as_posix()
        if key[:len(LORAS_KEY)] == LORAS_KEY:  # (identity, teacher_loras, i, path): a path inside the list
            entries = copy.deepcopy(get_field(out, LORAS_KEY))
            entries[key[2]]["path"] = new
            out = with_field(out, LORAS_KEY, entries)
        else:
            out = with_field(out, key, new)
    return copy.deepcopy(out)


def materialized(raw: dict, base_dir: Path, source: str) -> dict:
    """`raw` with every path field absolute, exactly as dmad.contract.config.resolve_paths reads it from a
    file in `base_dir` (defaults included: output_dir "runs" means <base_dir>/runs), so the result
    means the same from any folder. Raises UserInputError (one line) when `raw` is invalid."""
    cfg = validate_config(migrate(raw), source, base_dir=base_dir)
    out = raw
    for group, name in PATH_FIELDS:
        value = getattr(getattr(cfg, group), name)
        if value is not None:
            out = with_field(out, (group, name), value)
    if cfg.identity.teacher_loras:
        out = with_field(out, LORAS_KEY, [x.model_dump(mode="json") for x in cfg.identity.teacher_loras])
    return copy.deepcopy(out)


def read_run_config(run_dir: Path) -> tuple[Path, Optional[dict], str]:
    """(run_dir, its parsed config.json or None, why not). Reads a file: call it off the GUI thread."""
    try:
        raw = read_json_file(run_dir / "config.json", "config")
    except UserInputError as e:
        return run_dir, None, str(e)
    if not isinstance(raw, dict):
        return run_dir, None, f"{run_dir / 'config.json'} is not a JSON object"
    return run_dir, raw, ""
