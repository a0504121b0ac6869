"""The bundle's one executable (PyInstaller, packaging/dmad_studio.spec): the desktop app by
default, and the engine's command line when the first argument is a `dmad` command, so the app
starts its engine as `<bundle>/dmad-studio train ...` (dmad.contract.paths.engine_argv). Also
`accelerate-launch ...` (accelerate's launcher, for multi-process runs: dmad.train.launch)."""
from __future__ import annotations

import gc
import multiprocessing
import sys


def engine_commands() -> set[str]:
    from dmad.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return set(sub.choices)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "accelerate-launch":
        from accelerate.commands.launch import main as launch

        sys.argv = ["accelerate-launch", *argv[1:]]
        launch()
        gc.freeze()  # as dmad.cli.entry: skip the interpreter's last collection
        return 0
    if argv and (argv[0] in engine_commands() or argv[0] == "--version"):
        from dmad.cli import entry as dmad_entry

        return dmad_entry(argv)
    from app.main import main as app_main

    return app_main(argv)


if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main(sys.argv[1:]))
