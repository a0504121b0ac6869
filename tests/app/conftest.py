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


@pytest.fixture(autouse=True)
def _no_leaked_timers(request):
    if "qtbot" not in request.fixturenames and "qapp" not in request.fixturenames:
        yield
        return
    from PySide6.QtCore import QCoreApplication, QEvent

    before = set(_active_timers())
    yield  # pytest-qt closes and deletes the test's widgets when qtbot is torn down, before this
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    leaked = [t for key, t in _active_timers().items() if key not in before]
    if leaked:  # a timer whose owner is only in a reference cycle goes with it: collect (~0.3 s), then look again
        gc.collect()
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
