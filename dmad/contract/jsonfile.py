"""Reading a user's JSON file (config, prompt set) with one-line errors: file and line:column for
syntax, and a key given twice is an error (json would silently keep the last value)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dmad.errors import UserInputError


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r} (only one value can apply)")
        seen.add(k)
    return dict(pairs)


def read_json_file(path: str | Path, what: str) -> Any:
    """The parsed JSON of `path`; `what` ("config", "prompt set") names the file in errors."""
    p = Path(path)
    if not p.is_file():
        raise UserInputError(f"{what} file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"{p}: cannot read {what} ({e.__class__.__name__}: {e})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise UserInputError(f"{p}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except ValueError as e:  # a duplicate key
        raise UserInputError(f"{p}: {e}") from None
