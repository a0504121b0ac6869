"""The run queue as data, without Qt: configs waiting to run one after another on the local GPU.

A queue lives in a folder of the app's data folder: `queue.json` (the entries, in order, and whether
the queue is running) and `configs/<id>.json`, a copy of each queued config with absolute paths (what
was queued is what runs: later edits in the Config tab do not change it). Every write is atomic
(dmad.contract.runs.atomic_write_*): a kill leaves the old file or the new one, never half of one.

An entry's states:
  waiting      queued, not started
  running      its run was started (run_dir once the engine has named its folder)
  interrupted  the app closed while it ran and stopped it with a checkpoint: it is continued first
               when the queue goes on
  finished | failed | stopped   how its run ended (stopped: by the user; the queue pauses)
  skipped      its config no longer validated when its turn came (`reason` says why)
The engine side is unchanged: one run folder per run (the Runs tab lists them).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from dmad.contract.jsonfile import read_json_file
from dmad.contract.runs import atomic_write_json, atomic_write_text
from dmad.errors import UserInputError

QUEUE_FILE = "queue.json"
CONFIGS = "configs"
WAITING, RUNNING, INTERRUPTED = "waiting", "running", "interrupted"
FINISHED, FAILED, STOPPED, SKIPPED = "finished", "failed", "stopped", "skipped"
ENDED = (FINISHED, FAILED, STOPPED, SKIPPED)
UNDER_WAY = (RUNNING, INTERRUPTED)  # started and not ended: the queue goes on with it first
VERSION = 1


@dataclass
class QueueEntry:
    id: str
    label: str                  # what the user queued: the config's file name or preset
    config: str                 # the queued copy (absolute path)
    added: float                # unix time
    state: str = WAITING
    reason: str = ""            # skipped / failed: one line; finished: how it ended
    run_dir: str = ""           # the run folder, once known
    ended: Optional[float] = None

    @classmethod
    def from_json(cls, raw: Any) -> Optional["QueueEntry"]:
        """An entry of queue.json, or None when it is not one (a hand-edited file loses that entry only)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("id", "label", "config")):
            return None
        entry = cls(**{k: v for k, v in raw.items() if k in names})
        if entry.state not in (WAITING,) + UNDER_WAY + ENDED or not isinstance(entry.added, (int, float)):
            return None
        return entry


@dataclass
class QueueFile:
    entries: list[QueueEntry] = field(default_factory=list)
    active: bool = False        # the queue runs (started and not paused)
    note: str = ""              # why it paused, or what the last load found


class RunQueue:
    """The queue in `folder`. Methods change it and save at once; read `entries` / `active`."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.file = self.folder / QUEUE_FILE
        self.data = QueueFile()
        self.problem = ""  # the last load's one-line problem ("" when the file was fine or absent)

    # ------------------------------------------------------------ reading and writing

    @property
    def entries(self) -> list[QueueEntry]:
        return self.data.entries

    @property
    def active(self) -> bool:
        return self.data.active

    def load(self) -> "RunQueue":
        """Read queue.json. A file that is not a queue is kept aside (queue.json.bad) and the queue
        starts empty, with `problem` saying so; entries that are not entries are dropped, said too."""
        self.problem = ""
        if not self.file.exists():
            return self
        try:
            raw = read_json_file(self.file, "run queue")
            if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
                raise UserInputError(f"{self.file}: not a run queue (no entries list)")
        except (UserInputError, OSError) as e:
            self.problem = f"the run queue could not be read ({e}); it was kept as {self.file.name}.bad"
            try:
                self.file.replace(self.file.with_name(self.file.name + ".bad"))
            except OSError:
                pass
            self.data = QueueFile()
            return self
        entries = [QueueEntry.from_json(e) for e in raw["entries"]]
        kept = [e for e in entries if e is not None]
        if len(kept) < len(entries):
            self.problem = f"{len(entries) - len(kept)} entries of {self.file} were not queue entries and were dropped"
        self.data = QueueFile(kept, bool(raw.get("active")), str(raw.get("note", "")))
        return self

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.file, {"version": VERSION, "active": self.data.active, "note": self.data.note,
                                      "entries": [asdict(e) for e in self.data.entries]})

    # ------------------------------------------------------------ changes

    def add(self, config: dict, label: str, now: Optional[float] = None) -> QueueEntry:
        """Queue `config` (a raw config with absolute paths: ConfigPanel.materialize's); a copy is kept."""
        now = time.time() if now is None else now
        n = 1 + max((int(e.id.rsplit("-", 1)[-1]) for e in self.entries if e.id.rsplit("-", 1)[-1].isdigit()),
                    default=0)
        entry_id = f"q{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{n}"
        path = self.folder / CONFIGS / f"{entry_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(config, indent=2) + "\n")
        entry = QueueEntry(entry_id, label, str(path), now)
        self.data.entries.append(entry)
        self.save()
        return entry

    def get(self, entry_id: str) -> Optional[QueueEntry]:
        return next((e for e in self.entries if e.id == entry_id), None)

    def remove(self, entry_id: str) -> bool:
        """Remove an entry that is not under way (its config copy too); False when it is or is absent."""
        entry = self.get(entry_id)
        if entry is None or entry.state in UNDER_WAY:
            return False
        self._drop(entry)
        self.save()
        return True

    def _drop(self, entry: QueueEntry) -> None:
        self.data.entries.remove(entry)
        try:
            Path(entry.config).unlink()
        except OSError:
            pass

    def move(self, entry_id: str, delta: int) -> bool:
        """Move a waiting entry up (-1) or down (+1) among the waiting ones."""
        waiting = [e for e in self.entries if e.state == WAITING]
        entry = self.get(entry_id)
        if entry is None or entry not in waiting:
            return False
        i = waiting.index(entry)
        j = i + delta
        if not 0 <= j < len(waiting):
            return False
        a, b = self.entries.index(waiting[i]), self.entries.index(waiting[j])
        self.entries[a], self.entries[b] = self.entries[b], self.entries[a]
        self.save()
        return True

    def clear_ended(self) -> int:
        """Remove every ended entry and its config copy; the queue file is written once."""
        ended = [e for e in self.entries if e.state in ENDED]
        for entry in ended:
            self._drop(entry)
        if ended:
            self.save()
        return len(ended)

    def set_active(self, active: bool, note: str = "") -> None:
        self.data.active, self.data.note = active, note
        self.save()

    def mark(self, entry_id: str, state: str, reason: str = "", run_dir: Optional[Path] = None,
             now: Optional[float] = None) -> None:
        entry = self.get(entry_id)
        if entry is None:
            return
        entry.state, entry.reason = state, reason
        if run_dir is not None:
            entry.run_dir = str(run_dir)
        entry.ended = (time.time() if now is None else now) if state in ENDED else None
        self.save()

    # ------------------------------------------------------------ questions

    def under_way(self) -> Optional[QueueEntry]:
        return next((e for e in self.entries if e.state in UNDER_WAY), None)

    def next_waiting(self) -> Optional[QueueEntry]:
        return next((e for e in self.entries if e.state == WAITING), None)

    def waiting(self) -> int:
        return sum(e.state == WAITING for e in self.entries)

    def pending(self) -> int:
        """Entries still to run: waiting or under way."""
        return sum(e.state in (WAITING,) + UNDER_WAY for e in self.entries)

    def summary(self) -> str:
        """ "3 runs: 2 finished, 1 skipped" over the entries that ended."""
        counts: dict[str, int] = {}
        for e in self.entries:
            if e.state in ENDED:
                counts[e.state] = counts.get(e.state, 0) + 1
        total = sum(counts.values())
        parts = ", ".join(f"{n} {state}" for state, n in counts.items())
        return f"{total} run{'s' if total != 1 else ''}: {parts}" if total else "no runs"
