"""The Training panel's health feed (issue 39): a run's health rows into the plot store, its alerts
into the banner and, seen live, one notification each.

Rows come from two places that tell the same thing: <run>/health.csv, read in a worker when a run is
shown (its history), and the run's `health` events. Whichever comes first is drawn; the other adds
nothing (the store keeps one value per iteration). A signal that stays in alert is announced once
(AlertTracker).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QObject, Signal

from app.engine.background import Task
from app.models.health import AlertTracker, HealthRow, HealthTable, event_alerts, read_health_csv, row_from_event
from app.models.series import SeriesStore
from app.widgets.failure_banner import HealthBanner
from app.widgets.plot_feed import PlotFeed
from app.widgets.plot_specs import health_alert_key, health_key


class HealthFeed(QObject):
    alert = Signal(str)  # a new alert, seen live: one line with its advice (a desktop notification)
    problem = Signal(str)  # health.csv could not be used: one line for the panel's log

    def __init__(self, store: SeriesStore, feed: PlotFeed, banner: HealthBanner, replaying: Callable[[], bool],
                 parent: Optional[QObject] = None):
        super().__init__(parent)
        self.store, self.feed, self.banner, self._replaying = store, feed, banner, replaying
        self.alerts = AlertTracker()  # which alerts are new (one banner / notification each)
        self.reads = Task(self)  # <run>/health.csv, read in a worker
        self.reads.done.connect(self._read)

    def read(self, run_dir: Path) -> None:
        """The run's history: its health.csv, read in a worker."""
        self.reads.submit(lambda: read_health_csv(run_dir))

    def reset(self) -> None:
        """Another run (or the same run cut back by a resume): forget alerts and drop a read under way."""
        self.alerts.reset()
        self.reads.reset()

    def show_event(self, it: Optional[int], data: dict) -> None:
        """A health event: its row on the Health page; a new alert raises the banner and, seen live,
        one notification."""
        row = row_from_event(it, data)
        if row is None:
            return
        self._add([row])
        fresh = self.alerts.new_alerts(row.iter, event_alerts(data))
        if not fresh:
            return
        self.banner.show_alerts(fresh)
        if not self._replaying():
            for alert in fresh:
                advice = f" — {alert['advice']}" if alert["advice"] else ""
                self.alert.emit(alert["message"] + advice)

    def _read(self, table: HealthTable) -> None:
        if table.problem:
            self.problem.emit(f"health: {table.problem}")
        self._add(sorted(table.rows, key=lambda r: r.iter))

    def _add(self, rows: list[HealthRow]) -> None:
        for row in rows:
            self.store.add_metric(row.iter, {health_key(s): v for s, v in row.values}, skip=())
            alerted = {health_alert_key(s): v for s, v in row.values if s in row.alerts}
            if alerted:
                self.store.add_metric(row.iter, alerted, skip=())
        if rows:
            self.feed.schedule()
