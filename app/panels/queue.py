"""The Queue tab: configs queued to run one after another on the local GPU, overnight.

Add (the Config tab's config, as Start would run it), reorder and remove waiting entries, start or
pause the queue, clear what has ended; double-click an entry with a run folder to open that run.
The policy is app/models/queue_runner.py, the data app/models/run_queue.py (a file in the app's data
folder that survives a restart); this tab shows them and asks for changes.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QStandardPaths, Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from app.models.queue_runner import QueueRunner
from app.models.run_queue import ENDED, UNDER_WAY, WAITING, QueueEntry
from app.widgets.elided_label import ElidedLabel

COLUMNS = ("Config", "State", "Run folder / reason", "Queued")
STATE_TEXT = {"waiting": "waiting", "running": "running", "interrupted": "interrupted (continues first)",
              "finished": "finished", "failed": "failed", "stopped": "stopped", "skipped": "skipped"}


def default_queue_dir() -> Path:
    return Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)) / "queue"


def status_text(runner: QueueRunner) -> str:
    q = runner.queue
    under = q.under_way()
    if q.active:
        head = f"Running: {under.label}" if under is not None else "Running"
        return f"{head} · {q.waiting()} waiting"
    note = f" ({q.data.note})" if q.data.note else ""
    if not q.pending():
        return f"Queue idle{note}"
    if not q.data.note:
        return f"Not started: Start queue runs them · {q.waiting()} waiting"
    return f"Queue paused{note} · {q.waiting()} waiting"


class QueuePanel(QWidget):
    add_requested = Signal()           # queue the Config tab's config (the window materializes it)
    open_requested = Signal(object)    # open this run folder (Path)

    def __init__(self, runner: QueueRunner, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.runner = runner
        self.buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        for key, text, tip in (
                ("add", "Add the Config tab's config", "Queue the config the Config tab shows, as Start would run "
                                                      "it (a copy: later edits do not change the queued run)"),
                ("up", "Move up", "Run the selected waiting config earlier"),
                ("down", "Move down", "Run the selected waiting config later"),
                ("remove", "Remove", "Take the selected config out of the queue (not one under way)"),
                ("clear", "Clear ended", "Remove every entry that has finished, failed, stopped or been skipped"),
                ("run", "Start queue", "Run the waiting configs one after another")):
            button = QPushButton(text)
            button.setToolTip(tip)
            row.addWidget(button)
            self.buttons[key] = button
        row.addStretch(1)
        self.buttons["add"].clicked.connect(lambda: self.add_requested.emit())
        self.buttons["up"].clicked.connect(lambda: self._move(-1))
        self.buttons["down"].clicked.connect(lambda: self._move(+1))
        self.buttons["remove"].clicked.connect(self._remove)
        self.buttons["clear"].clicked.connect(runner.clear_ended)
        self.buttons["run"].clicked.connect(self._run_or_pause)
        self.status = ElidedLabel()
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        for column in (0, 1, 3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._enable)
        self.table.cellDoubleClicked.connect(self._open)
        hint = QLabel("Runs start one after another when nothing else trains; a config that no longer validates "
                      "when its turn comes is skipped with the reason. The queue is kept when the app closes and "
                      "goes on when it opens again.")
        hint.setWordWrap(True)
        hint.setEnabled(False)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(self.table, 1)
        layout.addWidget(hint)
        runner.changed.connect(self.refresh)
        self.refresh()

    # ------------------------------------------------------------ showing

    def refresh(self) -> None:
        chosen = self.selected()
        entries = self.runner.queue.entries
        self.table.setRowCount(len(entries))
        for r, entry in enumerate(entries):
            for c, text in enumerate(self._cells(entry)):
                item = QTableWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, entry.id)
                item.setToolTip(text)
                self.table.setItem(r, c, item)
            if chosen is not None and entry.id == chosen.id:
                self.table.selectRow(r)
        self.status.setText(status_text(self.runner))
        self.buttons["run"].setText("Pause queue" if self.runner.queue.active else "Start queue")
        self._enable()

    @staticmethod
    def _cells(entry: QueueEntry) -> tuple[str, ...]:
        where = entry.run_dir or ""
        if entry.reason and entry.state not in UNDER_WAY:
            where = f"{Path(where).name}: {entry.reason}" if where else entry.reason
        return (entry.label, STATE_TEXT.get(entry.state, entry.state), where,
                time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.added)))

    def selected(self) -> Optional[QueueEntry]:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows:
            return None
        item = self.table.item(rows[0].row(), 0)
        return self.runner.queue.get(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None

    def _enable(self) -> None:
        entry = self.selected()
        waiting = entry is not None and entry.state == WAITING
        self.buttons["up"].setEnabled(waiting)
        self.buttons["down"].setEnabled(waiting)
        self.buttons["remove"].setEnabled(entry is not None and entry.state not in UNDER_WAY)
        self.buttons["clear"].setEnabled(any(e.state in ENDED for e in self.runner.queue.entries))
        self.buttons["run"].setEnabled(self.runner.queue.active or self.runner.queue.pending() > 0)

    # ------------------------------------------------------------ changes

    def select(self, entry_id: str) -> None:
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).data(Qt.ItemDataRole.UserRole) == entry_id:
                self.table.selectRow(r)

    def _move(self, delta: int) -> None:
        entry = self.selected()
        if entry is not None and self.runner.move(entry.id, delta):
            self.select(entry.id)

    def _remove(self) -> None:
        entry = self.selected()
        if entry is not None:
            self.runner.remove(entry.id)

    def _run_or_pause(self) -> None:
        if self.runner.queue.active:
            self.runner.pause()
        else:
            self.runner.start()

    def _open(self, row: int, _column: int) -> None:
        item = self.table.item(row, 0)
        entry = self.runner.queue.get(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None
        if entry is not None and entry.run_dir:
            self.open_requested.emit(Path(entry.run_dir))
