"""`dmad-studio --self-test`: is this installation (a source checkout or the PyInstaller bundle)
whole? The engine, started as the app starts it (a subprocess of engine_argv()), dry-runs the
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

from dmad.contract.paths import engine_argv

ENGINE_TIMEOUT_S = 600


def check_engine() -> tuple[bool, str]:
    from dmad.contract.paths import resource

    config = resource("configs", "demo.json")
    if not config.is_file():
        return False, f"the demo config is missing: {config}"
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dmad-self-test-") as tmp:
        cmd = engine_argv("train", "--config", str(config), "--dry-run", "--run-dir", str(Path(tmp) / "run"))
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


# ---------------------------------------------------------------- layout: `dmad-studio --check-layout`

LAYOUT_SIZE = (1280, 800)  # the size the window asks for, every panel usable
SMALL_SIZE = (1024, 700)   # the smallest screen it must fit, every panel usable
LAYOUT_SIZES = (LAYOUT_SIZE, SMALL_SIZE)
SETTLE_MS = 300            # after switching a tab: layouts and the first paint land
TOLERANCE_PX = 1


def settle(ms: int = SETTLE_MS) -> None:
    """Let the event loop run `ms` (layouts, timers, paints); a diagnostic walk, never the app's own path."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def _describe(w, top) -> str:
    chain, p = [], w
    while p is not None and p is not top:
        chain.append(p.objectName() or type(p).__name__)
        p = p.parentWidget()
    text = getattr(w, "text", None)
    said = text() if callable(text) else ""
    said = f" {said[:60]!r}" if isinstance(said, str) and said else ""
    return " > ".join(reversed(chain)) + said


def _in_scrolled_content(w, top) -> bool:
    """Inside a scroll area's viewport (a table's cells, a scrolled form): extending past is scrolling."""
    from PySide6.QtWidgets import QAbstractScrollArea

    p = w.parentWidget()
    while p is not None and p is not top:
        area = p.parentWidget()
        if isinstance(area, QAbstractScrollArea) and area.viewport() is p:
            return True
        p = area
    return False


def clipped_text(w) -> str:
    """Why `w` shows less text than it has ("" when it shows all): a label or button narrower than
    its text. An ElidedLabel elides by design (its tooltip has the text) and is not counted."""
    from PySide6.QtWidgets import QAbstractButton, QLabel

    from app.widgets.elided_label import ElidedLabel

    if isinstance(w, ElidedLabel) or not isinstance(w, (QLabel, QAbstractButton)) or not w.text():
        return ""
    if isinstance(w, QLabel) and w.wordWrap():
        need = w.heightForWidth(w.width())
        return f"needs {need} px height, has {w.height()}" if need > w.height() + TOLERANCE_PX else ""
    need = w.sizeHint().width()
    return f"needs {need} px width, has {w.width()}" if need > w.width() + TOLERANCE_PX else ""


def widget_problems(window, where: str) -> list[str]:
    """Visible widgets of `window` that extend past it or clip their text, one line each."""
    from PySide6.QtCore import QPoint, QRect
    from PySide6.QtWidgets import QWidget

    inside = window.rect().adjusted(-TOLERANCE_PX, -TOLERANCE_PX, TOLERANCE_PX, TOLERANCE_PX)
    out = []
    for w in window.findChildren(QWidget):
        if not w.isVisible() or w.isWindow() or w.width() <= 0 or w.height() <= 0:
            continue
        if not _in_scrolled_content(w, window):
            r = QRect(w.mapTo(window, QPoint(0, 0)), w.size())
            if not inside.contains(r):
                out.append(f"{where}: {_describe(w, window)} extends past the window "
                           f"({r.x()},{r.y()} {r.width()}x{r.height()} in {window.width()}x{window.height()})")
        why = clipped_text(w)
        if why:
            out.append(f"{where}: {_describe(w, window)} is clipped: {why}")
    return out


def window_problems(window, size: tuple[int, int] = LAYOUT_SIZE, on_screen: bool = True) -> list[str]:
    """The window against a screen of `size`: its minimum size, and (`on_screen`: a real display)
    its frame inside its screen's available area."""
    out = []
    hint = window.minimumSizeHint().expandedTo(window.minimumSize())
    if hint.width() > size[0] or hint.height() > size[1]:
        out.append(f"window: minimum size {hint.width()}x{hint.height()} exceeds a {size[0]}x{size[1]} screen")
    if window.width() > size[0] or window.height() > size[1]:
        out.append(f"window: {window.width()}x{window.height()}, larger than a {size[0]}x{size[1]} screen")
    if not on_screen:
        return out
    avail, frame = window.screen().availableGeometry(), window.frameGeometry()
    if not avail.adjusted(-TOLERANCE_PX, -TOLERANCE_PX, TOLERANCE_PX, TOLERANCE_PX).contains(frame):
        out.append(f"window: frame {frame.x()},{frame.y()} {frame.width()}x{frame.height()} is not inside the "
                   f"screen's available {avail.x()},{avail.y()} {avail.width()}x{avail.height()}")
    return out


def walk_panels(window, panels, settle_ms: int = SETTLE_MS) -> list[str]:
    """Show every panel, and every page of the tab widgets inside it, and collect widget_problems."""
    from PySide6.QtWidgets import QTabWidget

    out = []
    for name in panels:
        window.show_panel(name)
        settle(settle_ms)
        out += widget_problems(window, name)
        for tabs in window.panel(name).findChildren(QTabWidget):
            first = tabs.currentIndex()
            for i in range(tabs.count()):
                if i != first and tabs.isVisible():
                    tabs.setCurrentIndex(i)
                    settle(settle_ms)
                    out += widget_problems(window, f"{name} / {tabs.tabText(i)}")
            tabs.setCurrentIndex(first)
    return out


def show_for_check(window, size: tuple[int, int] = LAYOUT_SIZE) -> bool:
    """On a real display the window is shown as the app shows it (fitted to the screen); off screen
    (no screen to fit) at `size`. Returns whether it is on a real display."""
    from PySide6.QtGui import QGuiApplication

    from app.widgets.window_fit import show_fitted

    real = QGuiApplication.platformName() not in ("offscreen", "minimal")
    if real:
        show_fitted(window)
    else:
        window.resize(*size)
        window.show()
    return real


def check_layout(window, panels, sizes: tuple[tuple[int, int], ...] = LAYOUT_SIZES) -> int:
    """`dmad-studio --check-layout`: one line per problem on stdout; exit 0 when there is none. Off
    screen the window is walked at each of `sizes`; on a real display at the size its screen gives it
    (bench/real_window.py runs an X server of each size)."""
    real = show_for_check(window, sizes[0])
    if real:
        avail = window.screen().availableGeometry()
        sizes = ((avail.width(), avail.height()),)
    problems = []
    for size in sizes:
        if not real:
            window.resize(*size)
        settle(2 * SETTLE_MS)
        geo = window.frameGeometry()
        print(f"layout: window {geo.width()}x{geo.height()} at {geo.x()},{geo.y()} for a {size[0]}x{size[1]} "
              f"screen ({len(panels)} panels)", flush=True)
        found = window_problems(window, size, on_screen=real) + walk_panels(window, panels)
        problems += [f"{size[0]}x{size[1]}: {line}" for line in found]
    for line in problems:
        print(f"layout problem: {line}", flush=True)
    print("layout: " + ("ok" if not problems else f"{len(problems)} problems"), flush=True)
    return 0 if not problems else 1
