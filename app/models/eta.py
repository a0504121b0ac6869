"""A steady ETA: the recent pace (seconds per iteration, smoothed) times the iterations left.

The engine's own eta_s is the last log window's pace times what is left, so a window that held a
checkpoint save or a sample render makes it jump (seen: 4 and 22 minutes within minutes). Here the
pace is the wall time between consecutive metric events divided by the iterations between them, so a
save or a render is counted at its real cost, spread over the iterations around it; it is blended into
an exponential moving average weighted by iterations, whose half-life grows with the run (half the
iterations seen) up to HALF_LIFE_ITERS: early on, the pace is still settling (warm-up, compilation,
caches filling).

Between events the ETA counts down with the wall clock (the panel redraws once a second); a pause is
not counted (hold / release), nor is the gap across one a pace.
"""
from __future__ import annotations

from typing import Optional

HALF_LIFE_ITERS = 200.0  # iterations: at most the last few hundred decide the pace


class EtaSmoother:
    def __init__(self, half_life_iters: float = HALF_LIFE_ITERS):
        self._half_life = float(half_life_iters)
        self.reset()

    def reset(self) -> None:
        self._spi: Optional[float] = None  # smoothed seconds per iteration
        self._prev: Optional[tuple[float, int]] = None  # (t, iter) of the last event a pace can start from
        self._anchor: Optional[tuple[float, int]] = None  # (t, iter) the countdown starts from
        self._held_at: Optional[float] = None
        self._first_iter: Optional[int] = None
        self._max_steps: Optional[int] = None

    def add(self, t: float, iteration: int, step_time_s: object = None, max_steps: object = None) -> None:
        """One iteration metric event: its time (unix s), iteration, the engine's step_time_s (used only
        for the very first pace) and max_train_steps."""
        if isinstance(max_steps, int) and max_steps > 0:
            self._max_steps = max_steps
        if self._first_iter is None or iteration < self._first_iter:
            self._first_iter = iteration
        prev, self._prev = self._prev, (t, iteration)
        self._anchor = (t, iteration)
        if prev is None or iteration <= prev[1] or t <= prev[0]:  # a start, a rewind or a clock step
            if self._spi is None and isinstance(step_time_s, (int, float)) and step_time_s > 0:
                self._spi = float(step_time_s)
            return
        steps = iteration - prev[1]
        pace = (t - prev[0]) / steps
        if self._spi is None:
            self._spi = pace
            return
        # Half-life: half the iterations seen so far, at least this event's, at most the cap
        half_life = min(self._half_life, max(float(steps), (iteration - self._first_iter) / 2.0))
        weight = 1.0 - 0.5 ** (steps / half_life)
        self._spi += weight * (pace - self._spi)

    def note_event(self, kind: str, iteration: Optional[int], data: dict, t: float) -> None:
        """Any event of the run, as the Training panel records it: metrics pace, pauses hold."""
        if kind == "metric" and iteration is not None and data.get("source") != "sampler":
            self.add(t, iteration, data.get("step_time_s"), data.get("max_train_steps"))
        elif kind == "paused":
            self.hold(t)
        elif kind in ("resumed", "started"):
            self.release(t)

    def hold(self, t: float) -> None:
        """The run paused at t: the countdown stops, and the time until release() is no pace."""
        if self._held_at is None:
            self._held_at = t

    def release(self, t: float) -> None:
        """The run resumed (or started again) at t."""
        if self._held_at is not None and self._anchor is not None:
            self._anchor = (self._anchor[0] + max(0.0, t - self._held_at), self._anchor[1])
        self._held_at = None
        self._prev = None

    def seconds_per_iter(self) -> Optional[float]:
        return self._spi

    def eta(self, now: Optional[float] = None) -> Optional[float]:
        """Seconds left: at the last event's pace, minus the time since it (when `now` is given and the
        run is not held). None before the first event or without max_train_steps."""
        if self._spi is None or self._anchor is None or not self._max_steps:
            return None
        left = max(0, self._max_steps - self._anchor[1]) * self._spi
        if now is not None:
            left -= max(0.0, (self._held_at if self._held_at is not None else now) - self._anchor[0])
        return max(0.0, left)
