"""`dmad-studio [RUN_DIR] [--runs-root DIR] [--screenshots DIR] [--self-test] [--check-layout]`: the desktop app.

Known PySide6 pitfalls handled here: QApplication sets LC_NUMERIC from the environment (a German
locale would make "0,5" the decimal form for C parsers), so it is reset to "C" right after;
Ctrl+C reaches Python only while Python code runs, so a heartbeat timer hands control to the
interpreter a few times a second. On Linux, Qt's X11 (xcb) platform plugin needs system libraries
a plain desktop may lack (libxcb-cursor0 ...): without them, or without a reachable X display, Qt
aborts with a core dump and a paragraph that does not name the packages. So before QtGui is
loaded (QtWidgets is imported late for this), display_problem() dlopens the libraries and
connects to the display, and a problem is one line naming the packages, exit 1.
"""
from __future__ import annotations

import argparse
import ctypes
import locale
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

EXIT_BAD_INPUT = 2
EXIT_NO_DISPLAY = 1
SIGINT_HEARTBEAT_MS = 200  # how often Python gets control to run a pending SIGINT handler

# What Qt's GUI and its xcb plugin load from the system (readelf -d of PySide6's libQt6Gui,
# libQt6XcbQpa, libqxcb): soname, Debian/Ubuntu package, Fedora package.
QT_LINUX_LIBS = (
    ("libxcb-cursor.so.0", "libxcb-cursor0", "xcb-util-cursor"),
    ("libxcb-icccm.so.4", "libxcb-icccm4", "xcb-util-wm"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1", "xcb-util-keysyms"),
    ("libxcb-image.so.0", "libxcb-image0", "xcb-util-image"),
    ("libxcb-render-util.so.0", "libxcb-render-util0", "xcb-util-renderutil"),
    ("libxcb-util.so.1", "libxcb-util1", "xcb-util"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0", "libxkbcommon-x11"),
    ("libxkbcommon.so.0", "libxkbcommon0", "libxkbcommon"),
    ("libxcb.so.1", "libxcb1", "libxcb"),
    ("libxcb-randr.so.0", "libxcb-randr0", "libxcb"),
    ("libxcb-render.so.0", "libxcb-render0", "libxcb"),
    ("libxcb-shape.so.0", "libxcb-shape0", "libxcb"),
    ("libxcb-shm.so.0", "libxcb-shm0", "libxcb"),
    ("libxcb-sync.so.1", "libxcb-sync1", "libxcb"),
    ("libxcb-xfixes.so.0", "libxcb-xfixes0", "libxcb"),
    ("libxcb-xkb.so.1", "libxcb-xkb1", "libxcb"),
    ("libX11-xcb.so.1", "libx11-xcb1", "libX11-xcb"),
    ("libX11.so.6", "libx11-6", "libX11"),
    ("libEGL.so.1", "libegl1", "libglvnd-egl"),
    ("libGL.so.1", "libgl1", "libglvnd-glx"),
    ("libfontconfig.so.1", "libfontconfig1", "fontconfig"),
    ("libfreetype.so.6", "libfreetype6", "freetype"),
    ("libdbus-1.so.3", "libdbus-1-3", "dbus-libs"),
)


def _loadable(soname: str) -> bool:
    try:
        ctypes.CDLL(soname)  # dlopen: the same search Qt's loader does (ld.so.cache, LD_LIBRARY_PATH)
        return True
    except OSError:
        return False


def _x_connects(display: str) -> bool:
    """One xcb connection to `display`, closed again (a few ms on a local display)."""
    xcb = ctypes.CDLL("libxcb.so.1")
    xcb.xcb_connect.restype = ctypes.c_void_p
    xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
    xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
    conn = xcb.xcb_connect(display.encode(), None)
    try:
        return xcb.xcb_connection_has_error(conn) == 0
    finally:
        xcb.xcb_disconnect(conn)


def display_problem(env: Mapping[str, str], loadable: Callable[[str], bool] = _loadable,
                    connects: Callable[[str], bool] = _x_connects) -> Optional[str]:
    """Why Qt's X11 platform plugin would abort, in one line naming the packages; None when it can
    start (or another platform is used: offscreen, wayland; or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    platform = env.get("QT_QPA_PLATFORM", "").split(":")[0].strip()
    if (platform and platform != "xcb") or (not platform and env.get("WAYLAND_DISPLAY")):
        return None
    missing = [lib for lib in QT_LINUX_LIBS if not loadable(lib[0])]
    if missing:
        debian = " ".join(dict.fromkeys(deb for _, deb, _ in missing))
        fedora = " ".join(dict.fromkeys(fed for _, _, fed in missing))
        return (f"Qt's X11 (xcb) platform plugin cannot load: {', '.join(so for so, _, _ in missing)} not found; "
                f"install them: sudo apt-get install {debian} (Debian/Ubuntu) or sudo dnf install {fedora} (Fedora)")
    display = env.get("DISPLAY", "")
    if not display:
        return ("no X display: DISPLAY is not set (start dmad-studio in a desktop session; "
                "--screenshots and --check-layout also run with QT_QPA_PLATFORM=offscreen)")
    if not connects(display):
        return (f"cannot connect to the X display {display!r} (DISPLAY): is the X server running, "
                "and may this user use it (XAUTHORITY)?")
    return None


class _Parser(argparse.ArgumentParser):
    """Usage errors become one line on stderr and exit 2, as for `dmad`."""

    def error(self, message: str):  # type: ignore[override]
        raise _BadInput(f"{message} (see 'dmad-studio --help')")


class _BadInput(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dmad-studio", allow_abbrev=False,
                description="DMAD Studio: configure, start, watch and compare distillation runs.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="a run folder to open (a live run is reattached: its curves continue)")
    p.add_argument("--runs-root", metavar="DIR", help="the folder that holds the run folders (remembered)")
    p.add_argument("--screenshots", metavar="DIR",
                   help="save one PNG per panel into DIR (RUN_DIR, or the recorded demo run) and exit")
    p.add_argument("--self-test", action="store_true",
                   help="check this installation: the engine dry-runs the demo config, the window is built "
                        "off screen; exit 0 when both work")
    p.add_argument("--check-layout", action="store_true",
                   help="open RUN_DIR (or the recorded demo run) in a window fitted to the screen, show every "
                        "panel and report widgets that extend past the window or clip their text; exit 0 "
                        "when there are none")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Raises _BadInput with one line naming the problem."""
    args = build_parser().parse_args(list(argv))
    if args.run_dir is not None:
        args.run_dir = _check_run_dir(Path(args.run_dir).expanduser())
    if args.runs_root is not None:
        root = Path(args.runs_root).expanduser().resolve()
        if root.exists() and not root.is_dir():
            raise _BadInput(f"--runs-root is not a folder: {root}")
        args.runs_root = root
    if args.screenshots is not None:
        out = Path(args.screenshots).expanduser().resolve()
        if out.exists() and not out.is_dir():
            raise _BadInput(f"--screenshots is not a folder: {out}")
        args.screenshots = out
    return args


def _check_run_dir(path: Path) -> Path:
    from dmad.errors import UserInputError
    from dmad.contract.runs import RunFolder

    try:
        return RunFolder.open(path.resolve()).path
    except UserInputError as e:
        raise _BadInput(str(e)) from None


def _install_sigint(app, on_interrupt):
    """First Ctrl+C closes the window (which asks about a live run); a second one quits at once."""
    count = [0]

    def handler(signum, frame) -> None:
        count[0] += 1
        if count[0] == 1:
            QTimer.singleShot(0, on_interrupt)
        else:
            app.quit()

    from PySide6.QtCore import QTimer

    signal.signal(signal.SIGINT, handler)
    heartbeat = QTimer(app)
    heartbeat.timeout.connect(lambda: None)  # an empty Python slot: the interpreter runs signal handlers
    heartbeat.start(SIGINT_HEARTBEAT_MS)
    return heartbeat


def collect_garbage_on_the_gui_thread(interval_s: float = 1.0):
    """Python's cycle collector runs in whichever thread allocates when a threshold is crossed. The
    app reads run files in pool workers; a garbage cycle holding Qt objects freed there destroys
    QObjects off the GUI thread, which deadlocks with it (seen in the suite: a worker parsing
    events.jsonl stuck in QObject::~QObject while the GUI thread waited for the GIL). pyqtgraph's
    GarbageCollector turns automatic collection off and collects on a GUI-thread timer, with the
    same generation thresholds. Keep the returned object for the app's life."""
    from pyqtgraph.util.garbage_collector import GarbageCollector

    return GarbageCollector(interval=interval_s)


def _make_app():
    from PySide6.QtWidgets import QApplication  # loads QtGui: after display_problem()

    app = QApplication.instance() or QApplication(sys.argv[:1])
    locale.setlocale(locale.LC_NUMERIC, "C")  # after QApplication, which set it from the environment
    app.setApplicationName("DMAD Studio")
    app.setOrganizationName("dmad-studio")
    return app


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except _BadInput as e:
        print(f"dmad-studio: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    if args.self_test:
        from app.selftest import run

        return run()
    problem = display_problem(os.environ)
    if problem is not None:
        print(f"dmad-studio: error: {problem}", file=sys.stderr, flush=True)
        return EXIT_NO_DISPLAY
    app = _make_app()
    app.garbage_collector = collect_garbage_on_the_gui_thread()  # held as long as the app
    if args.screenshots is not None or args.check_layout:
        return _recorded(app, args)
    from PySide6.QtCore import QSettings, QThreadPool

    from app.widgets.window_fit import show_fitted
    from app.window import MainWindow  # after QApplication: widgets need it

    from app.panels.queue import default_queue_dir

    window = MainWindow(QSettings(), runs_root=args.runs_root, session_dir=default_queue_dir().parent / "session",
                        config_path=None)
    _install_sigint(app, window.close)
    if args.run_dir is not None:
        window.open_run(args.run_dir)
    show_fitted(window)
    code = app.exec()
    QThreadPool.globalInstance().waitForDone(5000)  # a scan in flight must not outlive the window
    return code


def _recorded(app, args: argparse.Namespace) -> int:
    """--screenshots and --check-layout: a copy of RUN_DIR (default: the recorded demo run)."""
    from PySide6.QtCore import QSettings, QThreadPool

    from app.screenshots import default_recorded_run, prepare_recorded_run

    source = args.run_dir or default_recorded_run()
    if source is None:
        what = "--screenshots" if args.screenshots is not None else "--check-layout"
        print(f"dmad-studio: error: {what} needs a RUN_DIR (the recorded demo run ships only in a source "
              "checkout: tests/app/fixtures/demo_run)", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    with tempfile.TemporaryDirectory(prefix="dmad-studio-shots-") as tmp:
        root = Path(tmp) / "runs"
        run = prepare_recorded_run(source, root)  # a copy: the panels never write into the original
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.IniFormat)  # the user's stay untouched
        if args.check_layout:
            code = _check_layout(settings, root, run)
        else:
            code = _screenshots(app, settings, root, run, args.screenshots)
        QThreadPool.globalInstance().waitForDone(5000)
        return code


def _check_layout(settings, root: Path, run: Path) -> int:
    from app.screenshots import no_nvml
    from app.selftest import check_layout
    from app.window import PANELS, MainWindow

    window = MainWindow(settings, runs_root=root, load_nvml=no_nvml)
    window.open_run(run)
    try:
        return check_layout(window, PANELS)
    finally:
        window.close()


def _screenshots(app, settings, root: Path, run: Path, out: Path) -> int:
    from app.screenshots import ScreenshotRun

    shots = ScreenshotRun(settings, root, run, out)
    _install_sigint(app, app.quit)
    shots.start()
    code = app.exec()
    for path in shots.saved:
        print(path)
    return code if code else (0 if shots.ok() else 1)


if __name__ == "__main__":
    raise SystemExit(main())
