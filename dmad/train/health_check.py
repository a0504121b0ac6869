"""A validation's health signals (dmad.sample.health) in the run folder: one health.csv row and one
`health` event right after the validation's `samples` event, each alert also a `warning` event,
and with observation.health.stop_on_alert the request to stop the run (HealthState.stop_signal).
Rank 0 only; it reads the PNGs just written and the teacher reference's (whose levels it keeps),
so it costs no network pass and nothing in a training step.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dmad.contract.prompts import PromptSet
from dmad.contract.runlog import CsvAppender, HEALTH_COLUMNS, health_row, read_health
from dmad.contract.runs import SAMPLES_META
from dmad.sample import health
from dmad.train.trackers import log_values


@dataclass
class HealthState:
    """What a session keeps between validations: the teacher reference's images and levels (read
    once), and the alert that asks the run to stop (stop_on_alert), with the last healthy checkpoint."""

    teacher_key: Optional[tuple] = None
    teacher_images: dict[str, list[Any]] = field(default_factory=dict)
    teacher_levels: dict[str, health.PromptLevels] = field(default_factory=dict)
    stop_signal: Optional[str] = None
    healthy_checkpoint: Optional[int] = None


def folder_images(folder: Path, prompt_set: PromptSet) -> dict[str, list[Any]]:
    """{item id: its images, seed k at index k} of a samples folder, from its meta.json (file, then
    health_files); an item's list stops at its first missing file, so index k is always seed k."""
    try:
        items = json.loads((folder / SAMPLES_META).read_text(encoding="utf-8")).get("items")
    except (OSError, ValueError, AttributeError, RecursionError):
        return {}
    out = {}
    for item in prompt_set.items:
        entry = items.get(item.id) if isinstance(items, dict) else None
        if not isinstance(entry, dict):
            continue
        names = [entry.get("file"), *(entry.get("health_files") or [])][:max(1, prompt_set.health_seeds)]
        images = []
        for name in names:
            path = folder / str(name)
            if not isinstance(name, str) or "/" in name or "\\" in name or not path.is_file():
                break
            images.append(health.load_image(path))
        if images:
            out[item.id] = images
    return out


def _teacher(state: HealthState, folder: Path, prompt_set: PromptSet) -> None:
    """The teacher reference's images and levels, read again only when its meta.json changed."""
    meta = folder / SAMPLES_META
    try:
        st = meta.stat()
        key = (st.st_mtime_ns, st.st_size)
    except OSError:
        key = None
    if key != state.teacher_key:
        state.teacher_images = folder_images(folder, prompt_set) if key else {}
        state.teacher_levels = health.set_levels(state.teacher_images)
        state.teacher_key = key


def last_healthy_checkpoint(rows: list[dict]) -> Optional[int]:
    """The iteration of the last checkpoint whose health row raised no alert; None when none."""
    for r in reversed(rows):
        name = r.get("checkpoint")
        if name and not r.get("alerts") and name.startswith("iter_") and name[5:].isdigit():
            return int(name[5:])
    return None


def record_health(s, tr, out: Path, checkpoint: Optional[str]) -> None:
    """Rank 0, right after the validation's `samples` event of `out` (samples/iter_<N>): the
    signals against samples/teacher, a health.csv row, the `health` event and the alerts."""
    files, it, prompt_set = s.files, s.progress.iter, s.files.prompt_set
    settings = tr.cfg.observation.health
    state: HealthState = s.health
    _teacher(state, files.folder.samples_dir / "teacher", prompt_set)
    student = folder_images(out, prompt_set)
    signals = health.health_signals(student, state.teacher_images, state.teacher_levels)
    rows = read_health(files.folder.health_csv)
    healthy = last_healthy_checkpoint(rows)
    alerts = health.alerts_for(signals, it, health.history_of(rows), f"iter_{healthy}" if healthy is not None
                               else None) if settings.alerts else []
    with CsvAppender(files.folder.health_csv, HEALTH_COLUMNS) as csv_file:
        csv_file.append(health_row(it, checkpoint, signals, list(dict.fromkeys(a.signal for a in alerts))))
    files.events.emit("health", it, checkpoint=checkpoint, folder=str(out.resolve()), seeds=prompt_set.health_seeds,
                      prompts=len(prompt_set.items), signals=signals,
                      teacher=health.absolute_levels(state.teacher_levels), alerts=[a.to_event() for a in alerts])
    log_values(tr.accelerator, signals, it, prefix="health/")  # observation.report_to
    for a in alerts:
        files.events.emit("warning", it, message=a.warning())
    state.healthy_checkpoint = healthy if alerts or checkpoint is None else int(checkpoint[5:])
    if alerts and settings.stop_on_alert:
        state.stop_signal = alerts[0].signal
