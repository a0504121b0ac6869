"""app/engine/background.Task, the one way the app runs a scan off the GUI thread: answers come back
on the owner's thread; a raised error becomes one line; only the latest submission answers unless
every answer is asked for; reset drops what was submitted before it. And the PySide behaviour the
design rests on (docs/ARCHITECTURE.md, Threads): a worker's signal emit releases the GIL while Qt
delivers it, so a worker never holds the GIL while it waits on Qt's locks."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from PySide6.QtCore import QThreadPool

from app.engine.background import Task


def _serial_task(every_answer: bool = False) -> tuple[Task, QThreadPool, list]:
    """A Task on a one-thread pool (jobs run in submission order) and the list its answers go to."""
    pool = QThreadPool()
    pool.setMaxThreadCount(1)
    task, answers = Task(pool=pool, every_answer=every_answer), []
    task.done.connect(answers.append)
    return task, pool, answers


def test_the_answer_comes_back_on_the_owners_thread(qtbot):
    task = Task()
    answered_on = []
    task.done.connect(lambda result: answered_on.append((result, threading.get_ident())))
    with qtbot.waitSignal(task.done, timeout=10_000):
        task.submit(lambda: (threading.get_ident(), 42))
    (worker, value), gui = answered_on[0]
    assert value == 42 and gui == threading.get_ident() and worker != gui
    assert not task.busy()


def test_an_error_in_the_job_is_one_line_naming_its_type(qtbot):
    task = Task()

    def broken():
        raise PermissionError("runs/x: permission denied")

    with qtbot.waitSignal(task.failed, timeout=10_000) as sig:
        task.submit(broken)
    assert sig.args == ["PermissionError: runs/x: permission denied"]


def test_a_stale_scan_never_overwrites_a_newer_one(qtbot):
    task, pool, answers = _serial_task()
    gate = threading.Event()
    task.submit(lambda: gate.wait(10) and "old")
    task.submit(lambda: "new")
    gate.set()
    qtbot.waitUntil(lambda: not task.busy(), timeout=10_000)
    assert answers == ["new"]
    pool.waitForDone()


def test_every_answer_delivers_each_submission_in_order(qtbot):
    task, pool, answers = _serial_task(every_answer=True)
    for i in range(5):
        task.submit(lambda i=i: i)
    qtbot.waitUntil(lambda: len(answers) == 5, timeout=10_000)
    assert answers == [0, 1, 2, 3, 4]
    pool.waitForDone()


def test_reset_drops_the_answers_of_what_was_submitted_before_it(qtbot):
    task, pool, answers = _serial_task(every_answer=True)
    gate = threading.Event()
    task.submit(lambda: gate.wait(10) and "before")
    task.reset()
    assert not task.busy()
    task.submit(lambda: "after")
    gate.set()
    qtbot.waitUntil(lambda: answers == ["after"], timeout=10_000)
    pool.waitForDone()
    qtbot.wait(50)  # a late "before" would have been delivered by now
    assert answers == ["after"]


_EMIT_FROM_A_WORKER = """
import sys, threading
from PySide6.QtCore import QCoreApplication, QObject, Qt, QTimer, Signal, Slot

class Receiver(QObject):
    threads = []

    @Slot(int)
    def on_value(self, _value):  # Python: needs the GIL, on the GUI thread
        self.threads.append(threading.get_ident())

class Emitter(QObject):
    value = Signal(int)

app = QCoreApplication([])
receiver, emitter = Receiver(), Emitter()
emitter.value.connect(receiver.on_value, Qt.ConnectionType.BlockingQueuedConnection)

def work():
    for i in range(20):
        emitter.value.emit(i)
    QTimer.singleShot(0, app, app.quit)

QTimer.singleShot(0, threading.Thread(target=work, daemon=True).start)
app.exec()
sys.exit(0 if receiver.threads == [threading.get_ident()] * 20 else 3)
"""


def test_a_workers_emit_releases_the_gil_while_qt_delivers_it():
    """BlockingQueuedConnection: the worker waits inside Qt until the GUI thread has run a Python
    slot, which needs the GIL. Were the GIL held through emit, as PySide holds it through Qt's image
    readers, the two threads would deadlock; so this runs in a child process, and a hang is a
    failure, not a stuck suite (the bound guards against a deadlock; it is no speed limit)."""
    try:
        done = subprocess.run([sys.executable, "-c", _EMIT_FROM_A_WORKER], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    except subprocess.TimeoutExpired:
        pytest.fail("a worker's emit deadlocked with the GUI thread: PySide held the GIL through it")
    assert done.returncode == 0, done.stderr
