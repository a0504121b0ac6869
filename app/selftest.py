"""`dmad-studio --self-test`: is this installation (a source checkout or the PyInstaller bundle)
whole? The engine, started as the app starts it (a subprocess of engine_command()), dry-runs the
built-in demo config (config, data scan, teacher inspection, memory ledger: torch, diffusers and
the shipped resources all load); then the main window is built and closed off screen (Qt, its
platform plugin, pyqtgraph). One line per check on stdout; exit 0 when both pass, 1 otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.engine.command import engine_command

ENGINE_TIMEOUT_S = 600


def check_engine() -> tuple[bool, str]:
    from dmad.contract.paths import resource

    config = resource("configs", "demo.json")
    if not config.is_file():
        return False, f"the demo config is missing: {config}"
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dmad-self-test-") as tmp:
        cmd = [*engine_command(), "train", "--config", str(config), "--dry-run",
               "--run-dir", str(Path(tmp) / "run")]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"the engine did not run: {e}"
    if r.returncode != 0 or "Memory ledger" not in r.stdout:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        return False, f"engine dry run of the demo config exited {r.returncode}: {last}"
    return True, f"engine dry run of the demo config ({time.perf_counter() - t:.1f} s)"


def check_window() -> tuple[bool, str]:
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    t = time.perf_counter()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory(prefix="dmad-self-test-") as tmp:
        from app.window import MainWindow

        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.IniFormat)
        window = MainWindow(settings, runs_root=Path(tmp) / "runs")
        window.show()
        app.processEvents()
        tabs = window.tabs.count() if hasattr(window, "tabs") else None
        window.close()
        app.processEvents()
    return True, f"main window built ({tabs} panels, {time.perf_counter() - t:.1f} s)"


def run() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # a self-test needs no screen
    ok = True
    for name, check in (("engine", check_engine), ("app", check_window)):
        try:
            passed, what = check()
        except Exception as e:  # noqa: BLE001 - a broken bundle is reported, not a traceback
            passed, what = False, f"{type(e).__name__}: {e}"
        ok &= passed
        print(f"self-test {name}: {'ok' if passed else 'FAILED'}: {what}", flush=True)
    print("self-test: " + ("passed" if ok else "failed"), flush=True)
    return 0 if ok else 1
