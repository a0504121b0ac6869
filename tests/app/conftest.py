"""App tests: a test that leaves a repeating QTimer of its own running fails (a timer that outlives
its widget keeps firing into a closed panel: rescans, polls and heartbeats that never stop). A
single-shot timer fires once and is gone (DmadCommand's SIGKILL after a kill's grace period)."""
from __future__ import annotations

import gc

import pytest


def _active_timers() -> dict[int, object]:
    """Every live, active, repeating QTimer. `type(o) is QTimer` (the app makes no subclass of it):
    the scan runs twice a test over the ~450,000 objects of a worker that has imported torch, and
    isinstance made it three times as long."""
    import shiboken6
    from PySide6.QtCore import QTimer

    return {id(o): o for o in gc.get_objects()
            if type(o) is QTimer and shiboken6.isValid(o) and o.isActive() and not o.isSingleShot()}


_frozen = False


def _collect_on_this_thread() -> None:
    """Free the test's garbage cycles here, on the GUI thread. Left to Python's automatic collection,
    a cycle holding Qt objects can be freed in whatever thread allocates next, e.g. a pool worker
    parsing events.jsonl, whose QObject destructor then deadlocks with the GUI thread (seen: a
    hang in test_engine_bridge); so, as in the app, there is no automatic collection while a Qt
    test runs, and this runs before and after it. The first call collects everything and freezes the survivors (gc.freeze:
    torch, diffusers and the session's fixtures, ~450,000 objects in a worker that trained in
    process), so each later one walks only what was made since: milliseconds, not 0.26 s."""
    global _frozen
    gc.collect()
    if not _frozen:
        gc.freeze()
        _frozen = True


@pytest.fixture(autouse=True)
def _no_leaked_timers(request):
    if "qtbot" not in request.fixturenames and "qapp" not in request.fixturenames:
        yield
        return
    from PySide6.QtCore import QCoreApplication, QEvent

    _collect_on_this_thread()
    before = set(_active_timers())
    gc.disable()  # as the app runs (app.main.collect_garbage_on_the_gui_thread): no collection in a pool worker
    try:
        yield  # pytest-qt closes and deletes the test's widgets when qtbot is torn down, before this
    finally:
        gc.enable()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    _collect_on_this_thread()
    leaked = [t for key, t in _active_timers().items() if key not in before]
    for t in leaked:
        t.stop()
    assert not leaked, ("the test left timers running: "
                        f"{[(t.objectName() or type(t.parent()).__name__, t.interval()) for t in leaked]}")



@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item):
    """pytest-qt closes every window a test added as the test ends (its own teardown hook, inside
    this one); a main window with unsaved config edits would then ask Save / Discard / Cancel in a
    modal box nobody answers offscreen, and the suite would hang. That last close discards; during
    the test the question is the app's own (tests of it answer the box themselves)."""
    import app.dialogs.close as close

    asked = close.ask_unsaved_config
    close.ask_unsaved_config = lambda *args, **kwargs: close.DISCARD
    try:
        yield
    finally:
        close.ask_unsaved_config = asked


OPEN_WAIT_MS = 20_000


@pytest.fixture
def open_and_wait(qtbot):
    """`open_and_wait(panel, run_dir)`: TrainingPanel.open_run (or MainWindow.open_run), then wait until
    the run is shown. The panel reads the folder in a worker (the GUI thread reads no run file), so the
    run shows when the worker's answer comes: `opened`. Returns open_run's answer (False: refused, and
    nothing to wait for); the run is shown once opening() is None (`opened` was emitted)."""
    def open_and_wait(panel, run_dir, **kwargs) -> bool:
        training = getattr(panel, "training", panel)
        opened = panel.open_run(run_dir, **kwargs)
        if opened:
            qtbot.waitUntil(lambda: training.opening() is None, timeout=OPEN_WAIT_MS)
        return opened
    return open_and_wait


@pytest.fixture(autouse=True)
def _own_app_data(tmp_path_factory, monkeypatch):
    """Each test's own app data folder (XDG_DATA_HOME: Qt's AppDataLocation on Linux): the run
    queue, unsaved configs and probes of one test never reach another's, nor the user's."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("app-data")))
