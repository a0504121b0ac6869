"""A Stop that takes long: what the Training panel offers while a run is stopping, and when.

Stop asks the engine to stop at the next iteration (or loading) boundary and save a checkpoint; an
iteration of a large model, or a checkpoint on a slow drive, can take minutes. While it stops the
panel offers, in order of what they cost:
  Stop now  control "stop_now": the engine stops at the next boundary WITHOUT writing a checkpoint
            (what it learned since its newest checkpoint is lost);
  Kill      the engine's process group is killed: for an engine that no longer reads its control file
            (hung in a data loader, a collective, a driver call). Offered once Stop now was sent, after
            KILL_AFTER_S of stopping, or at once when there is nothing to lose (no run folder yet).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

KILL_AFTER_S = 20.0  # seconds of stopping before Kill is offered without Stop now


@dataclass(frozen=True)
class StopOffer:
    visible: bool
    stop_now: bool  # the button is enabled
    kill: bool
    line: str       # what the bar says
    stop_now_tip: str
    kill_tip: str


def _since(checkpoint: Optional[int]) -> str:
    if checkpoint is None:
        return "since the run began (it has no checkpoint)"
    return f"since checkpoint iter_{checkpoint}"


class StopEscalation:
    """When stopping began and what was sent since; the panel asks `offer` once a second."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requested_at: Optional[float] = None
        self.stop_now_sent = False
        self.killed = False

    def requested(self, now: float) -> None:
        if self.requested_at is None:
            self.requested_at = now

    def sent_stop_now(self) -> None:
        self.stop_now_sent = True

    def offer(self, stopping: bool, now: float, has_run_dir: bool, kill_problem: str,
              checkpoint: Optional[int], iteration: Optional[int] = 0) -> StopOffer:
        """`kill_problem`: why Kill cannot work here ("" when it can); `checkpoint`: the newest one;
        `iteration`: the run's (None: no iteration has run yet, so a stop has nothing to save)."""
        if not stopping:
            return StopOffer(False, False, False, "", "", "")
        waited = now - self.requested_at if self.requested_at is not None else 0.0
        lost = _since(checkpoint)
        kill_ready = self.stop_now_sent or waited >= KILL_AFTER_S or not has_run_dir
        if self.killed:
            line = "Killed: waiting for the engine's process to end"
        elif self.stop_now_sent:
            line = f"Stopping now without a checkpoint ({waited:.0f} s); Kill ends the engine at once"
        elif iteration is None:  # loading or the teacher's samples: the engine ends without a checkpoint
            line = (f"Stopping before the first iteration: there is nothing to save yet; the engine ends at its next "
                    f"check ({waited:.0f} s)." + ("" if kill_ready else f" Kill is offered after {KILL_AFTER_S:.0f} s."))
        else:
            line = (f"Stopping: the engine saves a checkpoint at the next iteration boundary ({waited:.0f} s)."
                    + ("" if kill_ready else f" Kill is offered after {KILL_AFTER_S:.0f} s."))
        stop_now_tip = (f"Stop at the next iteration boundary WITHOUT saving a checkpoint: the iterations "
                        f"{lost} are lost" if has_run_dir else "the run folder does not exist yet: use Kill")
        kill_tip = kill_problem or (f"Kill the engine's processes now (confirmation first): the iterations {lost} "
                                    "are lost, and the run is marked failed (Continue goes on from its newest "
                                    "checkpoint)")
        if not kill_problem and not kill_ready:
            kill_tip = f"offered after {KILL_AFTER_S:.0f} s of stopping, or once Stop now was sent"
        return StopOffer(True, has_run_dir and not self.stop_now_sent and not self.killed,
                         kill_ready and not kill_problem and not self.killed, line, stop_now_tip, kill_tip)
