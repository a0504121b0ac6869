"""Where the built-in resources live (the repo's resources/ folder in a source checkout or an
editable install, the bundle's copy in a PyInstaller build, or $DMAD_RESOURCES when set), and
where caches go."""
from __future__ import annotations

import os
import sys
from pathlib import Path


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


def engine_command() -> list[str]:
    """How to start the engine's command line from this process: `python -m dmad`, or in the
    PyInstaller bundle the bundle's own executable (its entry point routes engine commands)."""
    return [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "dmad"]
