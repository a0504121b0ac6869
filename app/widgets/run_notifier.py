"""A desktop notification when the shown run finishes or fails: a run takes hours, and the window is
rarely the one in front when it ends.

QSystemTrayIcon.showMessage where the desktop has a system tray; otherwise (no tray, the offscreen
platform of tests and CI) the message goes to the status bar, so it is never lost and never crashes.
Only a change seen live is announced (running -> finished), not a run opened already ended. A new
health alert of the followed run (the Training panel's health_alert, issue 39) is announced too.
"""
from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import QObject
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QStyle, QSystemTrayIcon

from app.models.lifecycle import LIVE
from app.models.run_state import RunState

MESSAGE_MS = 15000
HEALTH_ALERT = "Health alert"
WARNINGS = ("Run failed", HEALTH_ALERT)


def _icon() -> QIcon:
    app = QApplication.instance()
    icon = app.windowIcon() if isinstance(app, QApplication) else QIcon()
    if icon.isNull() and isinstance(app, QApplication):
        icon = app.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon)  # a tray icon must have one
    return icon


class RunNotifier(QObject):
    """`fallback(text)`: where the message goes without a tray (the window's status bar)."""

    def __init__(self, state: RunState, fallback: Callable[[str], None], parent: Optional[QObject] = None):
        super().__init__(parent)
        self._state = state
        self._fallback = fallback
        self._last = state.state
        self._tray: Optional[QSystemTrayIcon] = None
        self.sent: list[tuple[str, str]] = []  # (title, message) of every notification, newest last
        state.state_changed.connect(self._on_state)

    def _on_state(self, state: str) -> None:
        was_live, self._last = self._last in LIVE, state
        if not was_live or state not in ("finished", "failed"):
            return
        run = self._state.run_dir.name if self._state.run_dir is not None else "The run"
        if state == "finished":
            self.notify("Run finished", f"{run} finished" + (f": {self._state.message}" if self._state.message else ""))
        else:
            self.notify("Run failed", f"{run} failed: {self._state.message or 'see the Training tab'}")

    def notify_health(self, line: str) -> None:
        """One new health alert: "diversity 41% of the teacher's at iteration 3,000, ... — advice"."""
        run = self._state.run_dir.name if self._state.run_dir is not None else "The run"
        self.notify(HEALTH_ALERT, f"{run}: {line}")

    def notify(self, title: str, message: str) -> None:
        self.sent.append((title, message))
        if QSystemTrayIcon.isSystemTrayAvailable() and QSystemTrayIcon.supportsMessages():
            if self._tray is None:
                self._tray = QSystemTrayIcon(_icon(), self)
                self._tray.setToolTip("DMAD Studio")
            self._tray.show()
            kind = QSystemTrayIcon.MessageIcon
            self._tray.showMessage(title, message, kind.Warning if title in WARNINGS else kind.Information,
                                   MESSAGE_MS)
        else:
            self._fallback(f"{title}: {message}")
