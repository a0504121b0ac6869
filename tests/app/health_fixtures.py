"""health.csv rows and health events as the engine writes them (the issue-39 contract), for app tests."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import json
import time

import pytest

from dmad.contract import events

COLUMNS = "iter,checkpoint,diversity,saturation,brightness,contrast,colourfulness,detail,teacher_distance,alerts"
SIGNALS = COLUMNS.split(",")[2:-1]
TEACHER = {"diversity": 0.31, "saturation": 0.42, "brightness": 0.5, "contrast": 0.21, "colourfulness": 0.33,
           "detail": 0.012}


def signals(diversity: float = 1.0, saturation: float = 1.0, detail: float = 1.0, distance: float = 0.1) -> dict:
    return {"diversity": diversity, "saturation": saturation, "brightness": 0.98, "contrast": 1.01,
            "colourfulness": 1.02, "detail": detail, "teacher_distance": distance}


def csv_row(it: int, values: dict, checkpoint: str = "", alerts: tuple = ()) -> str:
    cells = ["" if values.get(s) is None else f"{values[s]:.6g}" for s in SIGNALS]
    return ",".join([str(it), checkpoint, *cells, ";".join(alerts)]) + "\n"


def write_health_csv(run_dir: Path, rows: list[str]) -> Path:
    path = Path(run_dir) / "health.csv"
    path.write_text(COLUMNS + "\n" + "".join(rows), encoding="utf-8")
    return path


def alert(signal: str, value: float, it: int, since: Optional[int] = None) -> dict:
    return {"signal": signal, "value": value, "threshold": 0.6, "direction": "low", "since_iter": since,
            "message": f"{signal} {value:.0%} of the teacher's at iteration {it:,}"
                       + (f", falling since {since:,}" if since else ""),
            "advice": "lower the GAN weight or the generator's learning rate, raise the critic ratio, "
                      "or go back to an earlier checkpoint"}


def health_event(it: int, values: dict, folder: str = "", checkpoint: Optional[str] = None,
                 alerts: tuple = ()) -> str:
    """One events.jsonl line, written as the contract says (the engine's branch adds "health" to KINDS)."""
    data = {"checkpoint": checkpoint, "folder": folder, "seeds": 4, "prompts": 12, "signals": values,
            "teacher": TEACHER, "alerts": list(alerts)}
    return json.dumps({"v": 1, "t": round(time.time(), 3), "kind": "health", "iter": it, "data": data},
                      separators=(",", ":")) + "\n"


@pytest.fixture
def health_kind(monkeypatch):
    """The event kind `health` is known to the event parser, as in the engine's branch of issue 39
    (dmad/contract/events.py is the engine's; this side only reads it)."""
    if "health" not in events.KINDS:
        monkeypatch.setattr(events, "KINDS", events.KINDS + ("health",))
