"""DMAD Studio in a real X server with a window manager, on a 1280x800 (or --size 1024x700) screen:
does every panel fit?

    python bench/real_window.py [--display :94] [--size 1280x800] [--out DIR] [--screenshots DIR]

Not a test: CI has no X server (tests/app/test_layout.py runs the same geometry walk off screen).
Needs Xvfb, openbox, xdotool, xwininfo / xprop and ImageMagick's `import` (Debian: apt-get install
xvfb openbox xdotool x11-utils imagemagick, plus the Qt libraries the README lists). Starts Xvfb on --display and openbox,
then, with the recorded demo run (tests/app/fixtures/demo_run, copied):

1  `dmad-studio --check-layout`: the app fits its window to the screen as it does for a user,
   shows every panel (and every page of the tab widgets inside them) and reports each widget that
   extends past the window or clips its text, and a window frame not inside the screen.
2  `dmad-studio RUN` as a user starts it: xdotool finds the window, its frame geometry must lie
   inside the screen, then a click on the first tab and the wheel over the tab bar walk through
   every tab, a screen capture of each goes to --out (LOOK at them), and the captures must all
   differ (the tab really changed).
3  with --screenshots DIR: `dmad-studio --screenshots DIR`, grabbed from the real window (the
   README's pictures: docs/screenshots).

Everything it started is ended at the end (by process id). Exit 0 when every check passed. ~1 min.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABS = ("config", "data", "training", "samples", "playground", "runs", "queue", "memory")  # app.window.PANELS
TOOLS = ("Xvfb", "openbox", "xdotool", "xwininfo", "xprop", "import")
TAB_AT = (20, 13)  # px inside the window: on the first tab


class Session:
    """The processes this script started, ended in reverse order (SIGTERM, then SIGKILL)."""

    def __init__(self, display: str):
        self.display = display
        self.env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb")
        self.env.pop("WAYLAND_DISPLAY", None)
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=self.env, **kw)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def start_x(s: Session, size: str) -> None:
    lock = Path(f"/tmp/.X{s.display.lstrip(':')}-lock")
    if lock.exists():
        raise SystemExit(f"real_window: display {s.display} is taken ({lock}); choose another --display")
    s.start(["Xvfb", s.display, "-screen", "0", f"{size}x24", "-nolisten", "tcp"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if s.run(["xdotool", "getdisplaygeometry"]).returncode == 0:
            break
        time.sleep(0.1)
    else:
        raise SystemExit("real_window: Xvfb did not come up")
    s.start(["openbox"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # the window manager takes over the root window


def check_layout(s: Session) -> list[str]:
    r = s.run([sys.executable, "-m", "app", "--check-layout"], timeout=300)
    print(r.stdout.strip())
    if r.returncode != 0:
        return [f"--check-layout exited {r.returncode}: {r.stderr.strip()[-500:]}"]
    return []


def frame_geometry(s: Session, wid: str) -> tuple[int, int, int, int]:
    """(x, y, width, height) of the window with its frame, as the window manager placed it.
    (`xdotool getwindowgeometry` counts a reparenting manager's title bar twice: xwininfo's
    absolute client position plus _NET_FRAME_EXTENTS instead.)"""
    info = s.run(["xwininfo", "-id", wid]).stdout
    value = {k.strip(): int(v) for k, v in (line.split(":", 1) for line in info.splitlines() if ":" in line)
             if k.strip() in ("Absolute upper-left X", "Absolute upper-left Y", "Width", "Height")}
    extents = s.run(["xprop", "-id", wid, "_NET_FRAME_EXTENTS"]).stdout.split("=")[-1]
    left, right, top, bottom = ([int(x) for x in extents.split(",")] if "," in extents else [0, 0, 0, 0])
    return (value["Absolute upper-left X"] - left, value["Absolute upper-left Y"] - top,
            value["Width"] + left + right, value["Height"] + top + bottom)


def walk_tabs(s: Session, out: Path, size: tuple[int, int], work: Path) -> list[str]:
    run = work / "runs" / "demo_run"
    shutil.copytree(REPO / "tests" / "app" / "fixtures" / "demo_run", run)
    app = s.start([sys.executable, "-m", "app", str(run), "--runs-root", str(work / "runs")],
                  stdout=subprocess.DEVNULL, stderr=open(work / "app.log", "w"))
    found = s.run(["xdotool", "search", "--sync", "--onlyvisible", "--name", "DMAD Studio"], timeout=120)
    if found.returncode != 0 or app.poll() is not None:
        return [f"the window did not appear: {(work / 'app.log').read_text()[-500:]}"]
    wid = found.stdout.split()[0]
    time.sleep(3)  # scans, thumbnails and the first paints land
    problems = []
    x, y, w, h = frame_geometry(s, wid)
    print(f"window {wid}: frame {w}x{h} at {x},{y}")
    if x < 0 or y < 0 or x + w > size[0] or y + h > size[1]:
        problems.append(f"the window's frame {w}x{h} at {x},{y} is not inside the {size[0]}x{size[1]} screen")
    s.run(["xdotool", "windowactivate", "--sync", wid])
    # A click on the first tab (the tab bar is the top row of the window), then one wheel step down
    # over the tab bar per tab: the mouse as a user would use it, no keyboard focus needed
    s.run(["xdotool", "mousemove", "--window", wid, str(TAB_AT[0]), str(TAB_AT[1]), "click", "1"])
    digests = []
    for i, tab in enumerate(TABS):
        time.sleep(1.5)
        shot = out / f"{i + 1}-{tab}.png"
        s.run(["import", "-window", "root", str(shot)])
        digests.append(hashlib.sha1(shot.read_bytes()).hexdigest())
        print(f"captured {shot}")
        s.run(["xdotool", "click", "5"])
    if len(set(digests)) != len(digests):
        problems.append("two tabs looked the same: the wheel over the tab bar did not switch tabs")
    app.terminate()
    app.wait(timeout=30)
    return problems


def screenshots(s: Session, folder: Path) -> list[str]:
    r = s.run([sys.executable, "-m", "app", "--screenshots", str(folder)], timeout=600)
    print(r.stdout.strip())
    return [] if r.returncode == 0 else [f"--screenshots exited {r.returncode}: {r.stderr.strip()[-500:]}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--display", default=":94")
    p.add_argument("--size", default="1280x800")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "layoutshot")
    p.add_argument("--screenshots", type=Path, metavar="DIR", help="also regenerate the panel pictures into DIR")
    args = p.parse_args()
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        print(f"real_window: missing {', '.join(missing)} (apt-get install xvfb openbox xdotool x11-utils imagemagick)",
              file=sys.stderr)
        return 2
    size = tuple(int(x) for x in args.size.split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    s = Session(args.display)
    problems: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="dmad-real-window-") as work:
            # the user's settings, caches and probe folders stay untouched
            s.env.update(XDG_CONFIG_HOME=f"{work}/config", XDG_DATA_HOME=f"{work}/data", XDG_CACHE_HOME=f"{work}/cache")
            start_x(s, args.size)
            problems += check_layout(s)
            problems += walk_tabs(s, args.out, size, Path(work))
            if args.screenshots is not None:
                problems += screenshots(s, args.screenshots.resolve())
    finally:
        s.close()
    for line in problems:
        print(f"PROBLEM: {line}")
    print("real window: " + ("ok" if not problems else f"{len(problems)} problems"))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    raise SystemExit(main())
