"""Rate-limited redraws of the Training panel's plots from its SeriesStore.

Events only append to the store (amortised O(1)); a single-shot timer pushes the changed series to
their curves at most ~15 times a second, and less often when setData itself gets expensive
(tens of ms on million-point series), so redraws never take more than ~1/4 of the GUI thread.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

from PySide6.QtCore import QObject, QTimer, Signal

from app.models.series import SeriesStore

REFRESH_MS = 66  # plots redraw at most ~15 times a second


class PlotFeed(QObject):
    """`plots`: objects with refresh(store, dirty_keys) (the Training panel's PlotBoard)."""

    refreshed = Signal()  # setData ran for the series that changed

    def __init__(self, store: SeriesStore, plots: Sequence, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._store, self._plots = store, list(plots)
        self._timer = QTimer(self, singleShot=True, timeout=self.refresh)
        self._last, self._gap_ms = 0.0, float(REFRESH_MS)

    def schedule(self) -> None:
        """Redraw soon: at once if the last redraw is old enough, else when the gap has passed."""
        if not self._timer.isActive():
            wait_ms = self._gap_ms - (time.monotonic() - self._last) * 1000.0
            self._timer.start(max(0, int(wait_ms)))

    def mark(self, keys: list[str]) -> None:
        """These series must be redrawn although no point was added (smoothing changed)."""
        self._store.mark_dirty(keys)
        self.schedule()

    def refresh(self) -> None:
        t0 = time.monotonic()
        dirty = self._store.take_dirty()
        if dirty:
            for plot in self._plots:
                plot.refresh(self._store, dirty)
            self.refreshed.emit()
        self._last = time.monotonic()
        self._gap_ms = max(REFRESH_MS, 4000.0 * (self._last - t0))
