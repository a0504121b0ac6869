"""Events for the app's plain-Python models (napari's models with events, without Qt).

A model that holds rules (RunLifecycle, the config Document) says what changed through Emitters, so
its unit tests need no QApplication, widget or timer, and its Qt side only connects: a Qt signal's
`emit` is a callable like any other (`model.changed.connect(self.changed.emit)`).
"""
from __future__ import annotations

from typing import Any, Callable


class Emitter:
    """Callbacks called synchronously, in the order they were connected, with what `emit` got. An
    exception in one propagates to the emitter's caller (nothing is swallowed)."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: list[Callable[..., Any]] = []

    def connect(self, slot: Callable[..., Any]) -> None:
        self._slots.append(slot)

    def disconnect(self, slot: Callable[..., Any]) -> None:
        self._slots.remove(slot)

    def emit(self, *args: Any) -> None:
        for slot in tuple(self._slots):  # a slot may connect or disconnect others while we call
            slot(*args)
