"""RunState, the Qt face of the shown run's lifecycle that the window, the Runs panel and the notifier
read: it says what the lifecycle says, when it says it, as Qt signals. The lifecycle's rules are
tested without Qt in test_run_lifecycle.py."""
from __future__ import annotations

from app.models.lifecycle import RunLifecycle
from app.models.run_state import RunState


def ev(kind: str, it=None, **data) -> dict:
    return {"v": 1, "t": 1.0, "kind": kind, "iter": it, "data": data}


def test_run_state_mirrors_the_lifecycle_and_signals_what_it_signals(qapp, tmp_path):
    lifecycle = RunLifecycle()
    state = RunState(lifecycle)
    seen = []
    state.state_changed.connect(lambda new: seen.append(("state", new)))
    state.changed.connect(lambda: seen.append("changed"))
    lifecycle.start("/runs", now=0.0)
    lifecycle.set_run_dir(tmp_path)
    lifecycle.engine_event(ev("metric", 3, max_train_steps=9))
    assert seen == [("state", "starting"), "changed", "changed", "changed"]
    assert (state.state, state.run_dir, state.iteration, state.max_steps) == ("starting", tmp_path, 3, 9)
    assert state.is_live() and not state.is_ended()
    lifecycle.stop_requested()
    lifecycle.engine_event(ev("stopped", 3, last_checkpoint=3))
    lifecycle.engine_finished(0, "stopped at iteration 3 (checkpoint iter_3)", (), killed=False)
    assert seen[4:] == [("state", "stopping"), "changed", ("state", "stopped"), "changed", "changed"]
    assert (state.state, state.exit_code, state.message) == ("stopped", 0, "stopped at iteration 3 (checkpoint iter_3)")
    assert state.is_ended() and not state.is_live()
