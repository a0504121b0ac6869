"""RunState, the run lifecycle the Training panel writes and the window and Runs panel read: its
transitions and signals, without any widget."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.models.run_state import RunState


@pytest.fixture
def state(qapp):
    """A RunState and what it signalled: ("state", s) for state_changed, "changed" for changed."""
    s = RunState()
    s.seen = []
    s.state_changed.connect(lambda new: s.seen.append(("state", new)))
    s.changed.connect(lambda: s.seen.append("changed"))
    return s


def take(state: RunState) -> list:
    seen, state.seen = state.seen, []
    return seen


def test_a_new_state_is_idle_and_shows_nothing(state):
    assert (state.state, state.run_dir, state.iteration, state.max_steps, state.exit_code, state.message) == (
        "idle", None, None, None, None, "")
    assert not state.is_live() and not state.is_ended()


def test_our_own_run_from_start_to_stopped(state, tmp_path):
    state.start()
    assert state.state == "starting" and state.is_live() and state.run_dir is None
    assert take(state) == [("state", "starting"), "changed"]
    state.set_run_dir(tmp_path / "run")  # the engine's started event names the folder
    assert take(state) == ["changed"] and state.run_dir == tmp_path / "run"
    state.set_state("running")
    state.set_progress(1, 100)
    state.set_progress(2, 100)
    assert take(state) == [("state", "running"), "changed", "changed", "changed"]
    assert (state.iteration, state.max_steps) == (2, 100)
    for s in ("paused", "running", "stopping"):
        state.set_state(s)
        assert state.is_live()
    assert take(state) == [("state", "paused"), "changed", ("state", "running"), "changed",
                           ("state", "stopping"), "changed"]
    state.end("stopped", 0, "stopped at iteration 2\n(checkpoint iter_2)")
    assert take(state) == [("state", "stopped"), "changed"]
    assert (state.state, state.exit_code, state.message) == ("stopped", 0, "stopped at iteration 2 (checkpoint iter_2)")
    assert state.is_ended() and not state.is_live()
    assert (state.run_dir, state.iteration) == (tmp_path / "run", 2)  # still shown after the end


def test_nothing_changed_signals_nothing(state, tmp_path):
    state.open(tmp_path, "running")
    state.set_progress(5, 10)
    take(state)
    state.set_state("running")
    state.set_progress(5, 10)
    state.set_run_dir(tmp_path)
    assert take(state) == []


def test_a_failure_keeps_its_exit_code_and_reason(state):
    state.start()
    state.set_state("running")
    state.end("failed", None, "out of memory during first-forward")  # the error event, before the exit
    state.end("failed", 3, "out of memory during first-forward")  # then the engine's exit code
    assert take(state)[-3:] == [("state", "failed"), "changed", "changed"]
    assert (state.state, state.exit_code, state.message) == ("failed", 3, "out of memory during first-forward")


def test_only_end_states_end_a_run(state):
    with pytest.raises(ValueError, match="not an end state"):
        state.end("running", 0)
    assert state.state == "idle" and take(state) == []


def test_start_clears_the_last_run_and_is_refused_while_one_is_live(state, tmp_path):
    state.open(tmp_path / "old", "finished")
    state.set_progress(120, 120)
    state.end("finished", 0, "finished 120 iterations")
    state.start()
    assert (state.state, state.run_dir, state.iteration, state.max_steps, state.exit_code, state.message) == (
        "starting", None, None, None, None, "")
    with pytest.raises(RuntimeError, match="already starting"):
        state.start()


def test_opening_a_run_replaces_everything_and_always_signals(state, tmp_path):
    state.open(tmp_path / "a", "failed")
    state.end("failed", 1, "a loss became NaN")
    take(state)
    state.open(tmp_path / "b", "running")  # reattach to a live run
    assert take(state) == [("state", "running"), "changed"]
    assert (state.run_dir, state.exit_code, state.message, state.is_live()) == (Path(tmp_path / "b"), None, "", True)
    state.open(tmp_path / "b", "running")  # opened again: a new start for whoever shows it
    assert take(state) == ["changed"]
