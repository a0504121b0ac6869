"""Field-level diff of two run configs (config.json), as the Runs panel's "Compare configs" shows it.

Pure python, no Qt: nested dicts are flattened to dotted paths ("optimization.generator_lr");
lists are leaves and compared whole (student_timesteps [999, 499] vs [999, 749, 499] is one
difference, not three); a field present on one side only is shown as "(absent)". A field that a
side's distillation method does not read (critic_lr of a run without a critic, the peer method's
settings in a DMAD run) carries a note, so a DMAD run compared with a peer's run does not look like it
differs where neither cares.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.models.methods import is_unused, method_of, unused_note


class _Absent:
    """A field that one config does not have (an older config version, a hand-edited file)."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class FieldDiff:
    path: str     # dotted field path
    a: Any        # value in A, or ABSENT
    b: Any        # value in B, or ABSENT
    differs: bool
    unused_a: str = ""  # "unused with method <name>": A's method does not read this field
    unused_b: str = ""


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{"optimization": {"generator_lr": 1e-4}} -> {"optimization.generator_lr": 1e-4}.

    An empty dict stays a leaf ({}), so a group that one side has empty is still listed."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def same_value(a: Any, b: Any) -> bool:
    """JSON equality that keeps true apart from 1 (python's True == 1) and recurses into lists."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if a is ABSENT or b is ABSENT:
        return a is b
    return type(a) is type(b) and a == b or _both_numbers(a, b) and a == b


def _both_numbers(a: Any, b: Any) -> bool:
    # 1 and 1.0 mean the same learning rate or weight; pydantic writes whichever the user typed.
    return isinstance(a, (int, float)) and isinstance(b, (int, float))


def diff_configs(a: dict, b: dict, show_all: bool = False) -> list[FieldDiff]:
    """The fields of A and B in A's order (then B's extra fields); only differing ones unless show_all."""
    fa, fb = flatten(a), flatten(b)
    ma, mb = method_of(a), method_of(b)
    paths = list(fa) + [p for p in fb if p not in fa]
    out = []
    for path in paths:
        va, vb = fa.get(path, ABSENT), fb.get(path, ABSENT)
        differs = not same_value(va, vb)
        if differs or show_all:
            out.append(FieldDiff(path, va, vb, differs, unused_a=unused_note(ma) if is_unused(ma, path) else "",
                                 unused_b=unused_note(mb) if is_unused(mb, path) else ""))
    return out


def format_value(value: Any) -> str:
    """JSON text (null, true, "text", [1, 2]) so a string "1" and a number 1 look different."""
    if value is ABSENT:
        return "(absent)"
    return json.dumps(value, ensure_ascii=False)
