"""`dmad-studio [RUN_DIR] [--runs-root DIR] [--screenshots DIR] [--self-test]`: the desktop app.

Known PySide6 pitfalls handled here: QApplication sets LC_NUMERIC from the environment (a German
locale would make "0,5" the decimal form for C parsers), so it is reset to "C" right after;
Ctrl+C reaches Python only while Python code runs, so a heartbeat timer hands control to the
interpreter a few times a second.
"""
from __future__ import annotations

import argparse
import locale
import signal
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QSettings, QThreadPool, QTimer
from PySide6.QtWidgets import QApplication

EXIT_BAD_INPUT = 2
SIGINT_HEARTBEAT_MS = 200  # how often Python gets control to run a pending SIGINT handler


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


def _install_sigint(app: QApplication, on_interrupt) -> QTimer:
    """First Ctrl+C closes the window (which asks about a live run); a second one quits at once."""
    count = [0]

    def handler(signum, frame) -> None:
        count[0] += 1
        if count[0] == 1:
            QTimer.singleShot(0, on_interrupt)
        else:
            app.quit()

    signal.signal(signal.SIGINT, handler)
    heartbeat = QTimer(app)
    heartbeat.timeout.connect(lambda: None)  # an empty Python slot: the interpreter runs signal handlers
    heartbeat.start(SIGINT_HEARTBEAT_MS)
    return heartbeat


def _make_app() -> QApplication:
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
    app = _make_app()
    if args.screenshots is not None:
        return _screenshots(app, args)
    from app.window import MainWindow  # after QApplication: widgets need it

    window = MainWindow(QSettings(), runs_root=args.runs_root)
    _install_sigint(app, window.close)
    if args.run_dir is not None:
        window.open_run(args.run_dir)
    window.show()
    code = app.exec()
    QThreadPool.globalInstance().waitForDone(5000)  # a scan in flight must not outlive the window
    return code


def _screenshots(app: QApplication, args: argparse.Namespace) -> int:
    from app.screenshots import ScreenshotRun, default_recorded_run, prepare_recorded_run

    source = args.run_dir or default_recorded_run()
    if source is None:
        print("dmad-studio: error: --screenshots needs a RUN_DIR (the recorded demo run ships only in a source "
              "checkout: tests/app/fixtures/demo_run)", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    with tempfile.TemporaryDirectory(prefix="dmad-studio-shots-") as tmp:
        root = Path(tmp) / "runs"
        run = prepare_recorded_run(source, root)  # a copy: the panels never write into the original
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.IniFormat)  # the user's stay untouched
        shots = ScreenshotRun(settings, root, run, args.screenshots)
        _install_sigint(app, app.quit)
        shots.start()
        code = app.exec()
        QThreadPool.globalInstance().waitForDone(5000)
        for path in shots.saved:
            print(path)
        return code if code else (0 if shots.ok() else 1)


if __name__ == "__main__":
    raise SystemExit(main())
