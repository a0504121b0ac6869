"""Where a new run's folder goes, said before Start, with the same override for every command.

The app starts runs under the Runs tab's folder, so every run it starts is listed there, whatever
identity.output_dir the config names (a built-in preset's "../../runs" would land inside the
installation). The Config form shows identity.output_dir read-only with that said under it
(output_dir_note). That override is applied alike to Start, the Config tab's Dry run and the memory
estimate, so the dry run names the folder the run will use; and it is said before Start (the Start
button's tooltip and the state line), not found out afterwards.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

# The engine's default run name, dmad_<YYYYMMDD-HHMM>_<dataset id>_<prompt set>-<version>, short enough
# for the Training panel's state line
AUTO_NAME = "dmad_<date>-<time>_…"


def resolved_root(root: Path) -> Path:
    return Path(root).expanduser().resolve()


def root_override(root: Path) -> list[str]:
    """The --set arguments that put a run under `root` (JSON-quoted: always a string, whatever the
    path looks like; dmad.contract.config.parse_override)."""
    return [f"identity.output_dir={json.dumps(str(resolved_root(root)))}"]


def _identity(config: Optional[dict]) -> dict:
    identity = (config or {}).get("identity")
    return identity if isinstance(identity, dict) else {}


def new_run_folder(root: Path, config: Optional[dict]) -> str:
    """The folder a run started now would get: <root>/<run_name>, or the engine's dated default."""
    name = _identity(config).get("run_name")
    return str(resolved_root(root) / (name if isinstance(name, str) and name.strip() else AUTO_NAME))


def replaced_output_dir(root: Path, config: Optional[dict], base_dir: Path) -> Optional[str]:
    """The config's identity.output_dir as written when the override sends the run elsewhere, else None."""
    value: Any = _identity(config).get("output_dir")
    if not isinstance(value, str) or not value.strip():
        return None
    configured = Path(value).expanduser()
    configured = configured if configured.is_absolute() else Path(base_dir) / configured
    return None if configured.resolve() == resolved_root(root) else value


def output_dir_note(root: Path, config: Optional[dict], base_dir: Path) -> str:
    """What the Config form says under identity.output_dir, which it shows read-only: the app puts
    every run it starts in the Runs tab's folder (no silent override of the field)."""
    replaced = replaced_output_dir(root, config, base_dir)
    head = (f"Not used by the app: runs started here go to the Runs tab's folder, {resolved_root(root)}"
            if replaced is not None else f"The Runs tab's folder, {resolved_root(root)}")
    return head + " (change it on the Runs tab); `dmad train` on the command line uses this field."


def start_tooltip(root: Path, config: Optional[dict], base_dir: Path) -> str:
    text = f"Start a new run in {new_run_folder(root, config)}"
    replaced = replaced_output_dir(root, config, base_dir)
    if replaced is not None:
        text += (f"\nThe config's identity.output_dir ({replaced}) is replaced by the Runs tab's folder, "
                 "where the app lists its runs; Dry run uses the same folder.")
    return text
