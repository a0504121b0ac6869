"""The Qt binding itself must survive a long session: PySide6 6.12.0 on Python 3.11 dropped a
reference to True on every Signal.emit() and to None on every void call, so the app aborted with
"Fatal Python error: bool_dealloc" after a few thousand emits (minutes of watching a live run).
pyproject.toml excludes that release where it matters; this runs the same repro as a subprocess
(an abort cannot be caught in-process)."""
from __future__ import annotations

import os
import subprocess
import sys

REPRO = """
import sys
from PySide6.QtCore import QCoreApplication, QObject, Signal
app = QCoreApplication([])
class Emitter(QObject):
    fired = Signal(int)
e = Emitter()
true_refs, none_refs = sys.getrefcount(True), sys.getrefcount(None)
for i in range(20000):
    e.fired.emit(i)
    e.setObjectName("x")
app.processEvents()
print(sys.getrefcount(True) - true_refs, sys.getrefcount(None) - none_refs)
"""


def test_signal_emits_do_not_leak_or_drain_references():
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run([sys.executable, "-c", REPRO], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"the Qt binding aborted (refcount bug?): {proc.stderr[-800:]}"
    drift_true, drift_none = map(int, proc.stdout.split())
    assert abs(drift_true) < 100 and abs(drift_none) < 100, proc.stdout
