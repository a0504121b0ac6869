"""Reading a user's JSON (config, prompt set, dataset list, a teacher's configs, a --set value) and
checking the paths users type, with one-line errors: file and line:column for syntax, a key given
twice is an error (json would silently keep the last value), and input that would crash the parser
(nesting deeper than the interpreter's stack, NaN, 10**5000) is refused by name."""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

from dmad.contract.regular import NotRegularFile, fopen_regular, irregular, read_regular
from dmad.errors import UserInputError

# Real configs nest 3-4 levels; the json module recurses once per level (RecursionError near
# 1,000) and so do pydantic and json.dumps afterwards, so the limit sits far below both.
MAX_DEPTH = 32
MAX_FILE_BYTES = 64 * 2**20  # a config or prompt set is KBs; a multi-GB file is not one, and reading it costs the RAM
# Linux limits (NAME_MAX, PATH_MAX), the tightest of the usual file systems
MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4096
# Characters that end a line for str.splitlines, or that a terminal would act on.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class JsonSyntaxError(UserInputError):
    """The text is not JSON at all (parse_override then takes it as a plain string)."""


def printable(text: str) -> str:
    """`text` with control characters and line breaks escaped, so a user's key or path cannot
    break the one-line error it is quoted in."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads' object_pairs_hook for config text (files here, the app's JSON view): a key given
    twice is a ValueError naming it, since only one of its values could apply."""
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {printable(k)!r} (only one value can apply)")
        seen.add(k)
    return dict(pairs)



def _no_constant(token: str) -> float:
    raise ValueError(f"{token} is not a JSON number (JSON has no NaN or Infinity)")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"number {token[:40]} is out of range (beyond float64)")
    return value


class _NonFinite(str):
    """A NaN / Infinity token or a float beyond float64, kept as text while its key is looked for."""


def _non_finite_key(text: str) -> Optional[str]:
    """The dotted path of the first NaN / Infinity / 1e999 in `text` ("unet.sample_size",
    "items[2].seed"), for the error message; None when it cannot be told."""
    def keep(token: str) -> Any:
        value = float(token)
        return value if math.isfinite(value) else _NonFinite(token)

    try:
        stack = [("", json.loads(text, parse_constant=_NonFinite, parse_float=keep))]
    except (ValueError, RecursionError, MemoryError):
        return None
    while stack:
        path, v = stack.pop()
        if isinstance(v, _NonFinite):
            return path or "(top level)"
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        children = [(f"{path}.{k}" if isinstance(k, str) else f"{path}[{k}]", c) for k, c in items]
        stack.extend(reversed(children))
    return None


def _depth(value: Any) -> int:
    """Nesting depth of a parsed value, without recursion (1: a scalar)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            break
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        stack.extend((c, d + 1) for c in children)
    return deepest


def loads_json(text: str, where: str) -> Any:
    """The parsed JSON of `text`; UserInputError naming `where` (a file, a --set item) otherwise.
    Refuses what json.loads would accept but the engine cannot use: NaN / Infinity tokens and
    numbers beyond float64, duplicate keys, and nesting deeper than MAX_DEPTH."""
    where = printable(where)
    try:
        value = json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=_no_constant,
                           parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise JsonSyntaxError(f"{where}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise UserInputError(f"{where}: JSON nested too deeply (more than {MAX_DEPTH} levels)") from None
    except MemoryError:
        raise UserInputError(f"{where}: JSON too large to read") from None
    except ValueError as e:  # a duplicate key, NaN, 1e999, an integer of more than 4300 digits
        key = _non_finite_key(text) if "NaN" in str(e) or "float64" in str(e) else None
        where = f"{where}: {printable(key.lstrip('.'))}" if key else where
        raise UserInputError(f"{where}: invalid JSON: {printable(str(e))}") from None
    if _depth(value) > MAX_DEPTH:
        raise UserInputError(f"{where}: JSON nested too deeply (more than {MAX_DEPTH} levels)")
    return value


# A run folder's small files (status.json, config.json, prompt_set.json) are KBs; the app reads them
# as it finds them, some on its GUI thread (status.json every poll), so a bigger one is not read.
RUN_FILE_MAX_BYTES = 4 * 2**20


def read_json_or_problem(path: str | Path, max_bytes: int = RUN_FILE_MAX_BYTES) -> tuple[Any, str]:
    """(the parsed JSON of `path`, "") or (None, one line naming the file and what is wrong); never
    raises. For files the app finds in a run folder, which a user (or an attacker) may have
    written: missing or unreadable, larger than `max_bytes` (not read at all), not UTF-8, not
    JSON, or nested deeper than the parser's stack each become a line, not a traceback. A FIFO,
    a folder or a device in its place is refused without waiting on it (dmad.contract.regular)."""
    name = printable(Path(path).name)
    try:
        data = read_regular(path, max_bytes + 1)
    except NotRegularFile as e:
        return None, f"{name} is {e.kind}, not a regular file: not read"
    except OSError as e:
        return None, f"{name} cannot be read: {printable(str(e))}"
    if len(data) > max_bytes:
        return None, f"{name} is larger than {max_bytes // 2**20} MiB, more than any the engine writes: not read"
    try:
        return json.loads(data.decode("utf-8")), ""
    except UnicodeDecodeError:
        return None, f"{name} is not UTF-8 text"
    except json.JSONDecodeError as e:
        return None, f"{name} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
    except RecursionError:
        return None, f"{name} is nested too deeply to read"
    except (ValueError, MemoryError) as e:  # an integer of more than 4300 digits
        return None, f"{name} is not valid JSON: {printable(str(e))}"


def path_problem(path: str) -> Optional[str]:
    """Why `path` cannot name a file on this system (checked before any OS call, which would raise
    ValueError or OSError ENAMETOOLONG); None when it can."""
    if "\x00" in path:
        return "path contains a NUL byte"
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        return "path contains characters that cannot be encoded for this file system"
    if len(raw) > MAX_PATH_BYTES:
        return f"path is {len(raw)} bytes long (at most {MAX_PATH_BYTES})"
    longest = max(raw.split(os.fsencode(os.sep)), key=len)
    if len(longest) > MAX_NAME_BYTES:
        return f"a path component is {len(longest)} bytes long (at most {MAX_NAME_BYTES})"
    return None


def check_path(path: str | Path, what: str) -> Path:
    """`path` as a Path; UserInputError '<what>: <problem>' when it cannot name a file."""
    problem = path_problem(str(path))
    if problem:
        raise UserInputError(f"{what}: {problem}")
    return Path(path)


def new_folder_and_temp(out: str | Path, what: str, noun: str) -> tuple[Path, Path]:
    """(out resolved, its temp sibling) for a command that writes folder `out` whole (into the temp
    folder, then one rename): UserInputError in one line when `out` exists, its parent does not,
    or it cannot be written. `noun` names what is written ("the LoRA")."""
    out = check_path(out, what).expanduser().resolve()
    if out.exists():
        raise UserInputError(f"{what} {out}: already exists; choose a new folder ({noun} is written whole)")
    if not out.parent.is_dir():
        raise UserInputError(f"{what} {out}: parent folder {out.parent} does not exist")
    check_output_folder(out, what)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    check_path(tmp, f"{what} (with the temp folder's suffix)")
    return out, tmp


def check_output_folder(out: Path, what: str, new: bool = True) -> None:
    """Output can go to folder `out` (`new`: absent and creatable; else an existing folder or a
    creatable one): its nearest existing ancestor is a writable folder. Checked before any model
    loads, so a bad --out costs no loading time."""
    check_path(out, what)
    shown = printable(str(out))
    if new and (out.exists() or out.is_symlink()):
        raise UserInputError(f"{what} {shown} already exists (choose another folder or remove it)")
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserInputError(f"{what} {shown}: {printable(str(parent))} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserInputError(f"{what} {shown}: cannot write in {printable(str(parent))} (permission denied)")
    _try_folder_in(parent, f"{what} {shown}")


def check_output_file(path: Path, what: str) -> None:
    """A file can be written at `path` (replacing one there): it is no folder, and its folder exists
    or can be made (check_output_folder). Checked before the work that produces it."""
    check_path(path, what)
    if path.is_dir():
        raise UserInputError(f"{what} {printable(str(path))} is a folder, not a file")
    check_output_folder(path.parent, what, new=False)


def _try_folder_in(parent: Path, where: str) -> None:
    """Make and remove a folder in `parent`: what os.access cannot tell (a /proc or /sys path, where
    root passes it; a read-only mount seen through a writable bind) answers here, as one line."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dmad-check-", dir=parent))
    except OSError as e:
        raise UserInputError(f"{where}: cannot create a folder in {printable(str(parent))} "
                             f"({printable(e.strerror or str(e))})") from None


def make_output_folder(path: Path, what: str) -> None:
    """mkdir -p `path` for output: a place the OS refuses (/proc, a read-only mount) is one line
    naming `what` (exit 2). A full disk is raised as it is, for the writer's own line."""
    from dmad.contract.diskspace import is_disk_full

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if is_disk_full(e):
            raise
        raise UserInputError(f"{what}: cannot create {printable(str(path))} ({printable(e.strerror or str(e))})") \
            from None


def read_json_file(path: str | Path, what: str) -> Any:
    """The parsed JSON of `path`; `what` ("config", "prompt set") names the file in errors."""
    p = check_path(path, f"{what} file")
    try:
        not_regular = irregular(p)
        if not_regular:
            raise UserInputError(f"{what} file {printable(not_regular)}")
        if not p.is_file():
            raise UserInputError(f"{what} file not found: {printable(str(p))}")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise UserInputError(f"{printable(str(p))}: {p.stat().st_size} bytes is too large for a {what} file "
                                 f"(at most {MAX_FILE_BYTES // 2**20} MiB)")
        with fopen_regular(p, "r", encoding="utf-8-sig") as f:
            text = f.read()
    except NotRegularFile as e:  # swapped in since the check above
        raise UserInputError(f"{what} file {printable(str(e))}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"{printable(str(p))}: cannot read {what} ({e.__class__.__name__}: "
                             f"{printable(str(e))})") from None
    return loads_json(text, str(p))
