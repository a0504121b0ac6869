"""What the app remembers between launches, without widgets: the config being edited, the tab, and
a run that was left training.

- The config: a saved, unchanged file is reopened by its path. Edits not saved are kept as a draft
  (draft.json in the app's data folder: the raw config, the folder its relative paths mean, the file
  it came from), written after each change off the GUI thread and atomically, so a crash or a kill
  loses nothing; a clean close that saved or discarded the edits removes it. The next launch
  reopens the draft as an unsaved document and says so.
- The tab: the one shown at close.
- A run left training ("Leave it running" at close, or an app that died): the next launch finds the
  live run under the runs folder (status.json's state with a live process, dmad.contract.runs.
  effective_state) and follows it again, saying so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dmad.contract.regular import read_regular
from dmad.contract.runs import LIVE_STATES, RunFolder, atomic_write_json, effective_state

DRAFT = "draft.json"
MAX_RUNS_SCANNED = 2000  # a runs folder of this many runs is read for status.json only


@dataclass(frozen=True)
class Draft:
    raw: dict
    base_dir: Path
    path: Optional[Path]  # the file the edits belong to (None: a preset or an untitled config)
    label: str            # what it was: "mine.json" or "untitled (preset CPU demo)"


def write_draft(folder: Path, draft: Draft) -> None:
    """Worker side: the draft, atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / DRAFT, {"raw": draft.raw, "base_dir": str(draft.base_dir),
                                       "path": str(draft.path) if draft.path is not None else None,
                                       "label": draft.label})


def remove_draft(folder: Path) -> None:
    try:
        (folder / DRAFT).unlink()
    except FileNotFoundError:
        pass


def read_draft(folder: Path) -> Optional[Draft]:
    """The draft left by the last session, or None (none, or not a draft: a damaged file is ignored)."""
    try:
        doc: Any = json.loads(read_regular(folder / DRAFT).decode("utf-8"))
        raw, base = doc["raw"], Path(doc["base_dir"])
        path = Path(doc["path"]) if doc.get("path") else None
        label = str(doc.get("label") or "the last session's config")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Draft(raw, base, path, label) if isinstance(raw, dict) else None


def find_live_run(root: Path, now: Optional[float] = None) -> Optional[Path]:
    """Worker side: the run under `root` that is still training (its process alive, its heartbeat
    fresh), the most recently beating one when there are several; None when none is."""
    live: list[tuple[float, Path]] = []
    try:
        folders = sorted(p for p in Path(root).iterdir() if p.is_dir())[:MAX_RUNS_SCANNED]
    except OSError:
        return None
    for folder in folders:
        try:
            status = RunFolder(folder).read_status()
        except (OSError, ValueError):
            continue
        if status and effective_state(status, now) in LIVE_STATES:
            beat = status.get("heartbeat")
            live.append((float(beat) if isinstance(beat, (int, float)) else 0.0, folder))
    return max(live)[1] if live else None
