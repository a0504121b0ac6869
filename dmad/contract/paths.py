"""Where the built-in resources live (the repo's resources/ folder in a source checkout or an
editable install, the bundle's copy in a PyInstaller build, or $DMAD_RESOURCES when set), and
where caches go; and how to start the engine's command line (engine_argv)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

# Weight files in pickle formats: refused everywhere (the engine's loaders, the app's path checks)
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")


def resources_dir() -> Path:
    env = os.environ.get("DMAD_RESOURCES")
    if env:
        return Path(env)
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"


def resource(*parts: str) -> Path:
    return resources_dir().joinpath(*parts)


def cache_root() -> Path:
    """Where dmad caches (latents, text embeddings, check-data fingerprints): $DMAD_CACHE_DIR,
    else $XDG_CACHE_HOME/dmad, else ~/.cache/dmad."""
    env = os.environ.get("DMAD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "dmad"


def engine_argv(*args: str) -> list[str]:
    """The command line that runs `dmad <args>` from this process: `python -m dmad <args>`, or in the
    PyInstaller bundle the bundle's own executable with the engine subcommand (packaging/entry.py
    routes a first argument that is a `dmad` command to the engine, anything else to the app). The
    only place that prefix is built: the app, the demo, the probe, command.txt and bench/ use it."""
    prefix = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "dmad"]
    return [*prefix, *args]
