"""`dmad-studio --screenshots DIR [RUN_DIR]`: one PNG per panel, with a recorded run loaded, for the docs.

The run is copied first (the panels must never write into a user's or the repository's folder)
and the absolute paths its events recorded (sample images, checkpoints) are rewritten to the copy.
Each panel is shown, given time for its background work (scans, the dry-run estimate, the plot
timer) to land, then grabbed; the sequence runs on timers, so nothing blocks the event loop.
Off screen (QT_QPA_PLATFORM=offscreen) the window is rendered at 1280x800 into an image; on a real
display (DISPLAY set, xcb) it is shown as a user sees it, fitted to the screen with the window
manager's frame, and the screen area under the frame is captured: what the picture shows is what
was on the screen, clipping included.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QObject, QSettings, QTimer
from PySide6.QtGui import QGuiApplication, QPixmap
from PySide6.QtWidgets import QApplication, QWidget

from app.widgets.window_fit import show_fitted
from app.window import PANELS, MainWindow
from dmad.contract.memory import PROBE_FILE
from dmad.contract.runs import RunFolder

RECORDED_RUN = Path(__file__).resolve().parent.parent / "tests" / "app" / "fixtures" / "demo_run"
RECORDED_PROBE = RECORDED_RUN.parent / "probe"  # a GPU probe's probe.json, for the Memory picture
SETTLE_MS = 800          # after switching tabs: plot timers (10-20 Hz) and table scans land
IDLE_POLL_MS = 100
MAX_WAIT_MS = 180_000    # the Memory tab's dry run imports torch in the engine (seconds to a minute)
SIZE = (1280, 800)
BIG_FILE = 16 * 2 ** 20  # checkpoint weights are not needed for a picture


def default_recorded_run() -> Optional[Path]:
    return RECORDED_RUN if RunFolder(RECORDED_RUN).events_jsonl.is_file() else None


def prepare_recorded_run(source: Path, root: Path) -> Path:
    """Copy `source` into root/<name> (weights left out) with its event paths pointing at the copy."""
    dst = Path(root) / Path(source).name
    shutil.copytree(source, dst, ignore=_skip_big)
    events = RunFolder(dst).events_jsonl
    if events.is_file():
        lines = events.read_text(encoding="utf-8").splitlines()
        old = _recorded_run_dir(lines)
        if old:
            lines = [json.dumps(_rebase(json.loads(line), old, str(dst)), separators=(",", ":"))
                     if line.strip() else line for line in lines]
            events.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst


def _skip_big(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if (Path(folder) / n).is_file() and (Path(folder) / n).stat().st_size > BIG_FILE]


def _recorded_run_dir(lines: list[str]) -> Optional[str]:
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("kind") == "started":
            run_dir = (ev.get("data") or {}).get("run_dir")
            return run_dir if isinstance(run_dir, str) and run_dir else None
    return None


def _rebase(obj: Any, old: str, new: str) -> Any:
    if isinstance(obj, str):
        return new + obj[len(old):] if obj == old or obj.startswith(old + "/") else obj
    if isinstance(obj, dict):
        return {k: _rebase(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebase(v, old, new) for v in obj]
    return obj


def on_real_display() -> bool:
    return QGuiApplication.platformName() not in ("offscreen", "minimal")


def grab_window(window: QWidget) -> QPixmap:
    """The window as it is on the screen, frame included (a real display), else rendered off screen."""
    if not on_real_display():
        return window.grab()
    frame = window.frameGeometry()
    return window.screen().grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height())


def no_nvml():
    # Pictures for the docs must not depend on the GPU of the machine that made them.
    raise ImportError("NVML disabled for screenshots")


class ScreenshotRun(QObject):
    """Shows every panel in order and saves DIR/<n>-<panel>.png; quits the application at the end."""

    def __init__(self, settings: QSettings, runs_root: Path, run_dir: Path, out_dir: Path,
                 parent: Optional[QObject] = None):
        super().__init__(parent)
        self.window = MainWindow(settings, runs_root=runs_root, load_nvml=no_nvml)
        self.window.resize(*SIZE)
        self._run, self._out = run_dir, Path(out_dir)
        self.saved: list[Path] = []
        self.timed_out: list[str] = []
        self._i = 0
        self._waited = 0

    def ok(self) -> bool:
        return len(self.saved) == len(PANELS)

    def start(self) -> None:
        self._out.mkdir(parents=True, exist_ok=True)
        self.window.open_run(self._run)
        if on_real_display():
            show_fitted(self.window)
        else:
            self.window.show()
        self.window.memory.estimate()  # runs in the engine while the other panels are shot
        if (RECORDED_PROBE / PROBE_FILE).is_file() and hasattr(self.window.memory, "open_probe"):
            self.window.memory.open_probe(RECORDED_PROBE)  # read only: the probe's table and curves
        self.window.data.check()  # `dmad check-data` on the config's dataset, for the Data picture
        QTimer.singleShot(SETTLE_MS, self._show_next)

    def _show_next(self) -> None:
        if self._i >= len(PANELS):
            self.window.close()
            QApplication.instance().exit(0 if self.ok() else 1)
            return
        self.window.show_panel(PANELS[self._i])
        self._waited = 0
        QTimer.singleShot(SETTLE_MS, self._grab_when_idle)

    def _grab_when_idle(self) -> None:
        name = PANELS[self._i]
        busy = getattr(self.window.panel(name), "busy", lambda: False)()
        if busy and self._waited < MAX_WAIT_MS:
            self._waited += IDLE_POLL_MS
            QTimer.singleShot(IDLE_POLL_MS, self._grab_when_idle)
            return
        if busy:
            self.timed_out.append(name)  # still shot: a picture of the waiting state beats none
        if self._waited:  # results just arrived: let them paint
            QTimer.singleShot(SETTLE_MS // 2, self._save)
        else:
            self._save()

    def _save(self) -> None:
        name = PANELS[self._i]
        path = self._out / f"{self._i + 1}-{name.lower()}.png"
        if grab_window(self.window).save(str(path)):
            self.saved.append(path)
        self._i += 1
        self._show_next()
