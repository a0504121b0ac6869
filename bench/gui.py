"""GUI responsiveness of DMAD Studio's Training panel, against its targets (TARGETS).

    python bench/gui.py [--quick] [--json OUT] [--seconds S]

a  event written -> point plotted: a writer thread appends metric events to a live run folder's
   events.jsonl at 50 events/s (each carries its write time in `t`); the panel follows the run as a
   reattach (EventFollower + its rate-limited refresh timer) and the time is taken when setData has
   run for that iteration (`plots_refreshed`). p50 / p95 / max. Target p95 <= 100 ms.
b  GUI-thread stalls during (a): a 5 ms precise QTimer records how late each tick fires. p99 / max.
   Target p99 <= 50 ms.
c  1,000,000 points on each of 6 loss curves (3 on the generator plot, 3 on the critic plot):
   time of one frame (view change of both + render of the Losses page with grab(), downsampling
   and clip-to-view on) for the whole range and for pans of a 10 % window. median / p95.
   Target <= 33 ms.
d  app start to window shown: a fresh interpreter imports the app, builds the main window
   (app.window.MainWindow, all panels), shows it and prints the time once the event loop has
   painted it; measured from just before the process is spawned. Also the Training panel alone.
   median of 3. Target <= 2 s.

Offscreen Qt platform unless a display is set (QT_QPA_PLATFORM is respected). Cost: ~40 s
(--quick ~15 s). Timings are of this machine only: record it next to the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.name == "nt"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
from PySide6.QtCore import QEventLoop, Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.panels.training import TrainingPanel  # noqa: E402
from dmad.contract.events import make_event  # noqa: E402
from dmad.contract.runs import RunFolder, atomic_write_json  # noqa: E402

RATE_HZ = 50
TARGETS = {"latency_p95_ms": 100.0, "stall_p99_ms": 50.0, "frame_ms": 33.0, "start_s": 2.0}
LOSSES = ("loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_d_gan", "loss_c")


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def wait(app: QApplication, seconds: float) -> None:
    """Run the event loop for `seconds` (a nested loop, as the app's own would)."""
    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


# ---------------------------------------------------------------- a + b: live latency and stalls

def _metric_line(it: int) -> bytes:
    ev = make_event("metric", it, **{k: 1.0 / it for k in LOSSES}, step_time_s=0.02, data_time_s=0.001,
                    mem_peak_alloc_gb=3.5, mem_device_used_gb=5.0, lr_generator=1e-5, max_train_steps=10**6,
                    eta_s=1000.0)
    ev = type(ev)(kind=ev.kind, iter=ev.iter, data=ev.data, t=time.time())  # full-precision write time
    return (ev.to_line() + "\n").encode("utf-8")


def _writer(path: Path, seconds: float, written: dict, stop: threading.Event) -> None:
    period = 1.0 / RATE_HZ
    start = time.perf_counter()
    with open(path, "ab", buffering=0) as f:
        for it in range(1, int(seconds * RATE_HZ) + 1):
            delay = start + it * period - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if stop.is_set():
                return
            line = _metric_line(it)
            written[it] = json.loads(line)["t"]
            f.write(line)  # one write() per line, as dmad.contract.events.EventWriter does


def bench_live(app: QApplication, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="dmad-bench-gui-") as tmp:
        run = RunFolder.create(Path(tmp) / "live")
        atomic_write_json(run.config_json, {"config_version": 1})
        atomic_write_json(run.status_json, {"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                                            "heartbeat": time.time() + seconds + 60})
        run.events_jsonl.write_bytes(b"")
        panel = TrainingPanel()
        panel.resize(1280, 800)
        panel.show()
        panel.open_run(run.path)
        written: dict[int, float] = {}
        latencies: list[float] = []
        seen = [0]

        def plotted(last_iter: int) -> None:
            now = time.time()
            for it in range(seen[0] + 1, last_iter + 1):
                if it in written:
                    latencies.append((now - written[it]) * 1000.0)
            seen[0] = max(seen[0], last_iter)

        panel.plots_refreshed.connect(plotted)
        late: list[float] = []
        ticker = QTimer(timerType=Qt.PreciseTimer, interval=5)
        last = [time.perf_counter()]

        def tick() -> None:
            now = time.perf_counter()
            late.append(max(0.0, (now - last[0]) * 1000.0 - 5.0))
            last[0] = now

        ticker.timeout.connect(tick)
        ticker.start()
        stop = threading.Event()
        writer = threading.Thread(target=_writer, args=(run.events_jsonl, seconds, written, stop), daemon=True)
        writer.start()
        wait(app, seconds + 1.0)
        stop.set()
        writer.join()
        ticker.stop()
        panel.close()
        points = len(panel.loss_plot.curve("loss_dm").getData()[0])
    return {"events_written": len(written), "points_plotted": points, "latency_p50_ms": pct(latencies, 50),
            "latency_p95_ms": pct(latencies, 95), "latency_max_ms": max(latencies, default=float("nan")),
            "stall_p99_ms": pct(late, 99), "stall_max_ms": max(late, default=float("nan")), "ticks": len(late)}


# ---------------------------------------------------------------- c: 1,000,000 points per curve

def bench_frames(app: QApplication, n_points: int, frames: int) -> dict:
    panel = TrainingPanel()
    panel.resize(1280, 800)
    panel.show()
    rng = np.random.default_rng(0)
    x = np.arange(1, n_points + 1, dtype=np.float64)
    for k, key in enumerate(LOSSES):
        panel.store.series(key).extend(x, 1.0 + k + np.cumsum(rng.normal(0, 0.01, n_points)))
    panel.store.mark_dirty(LOSSES)
    t0 = time.perf_counter()
    panel.feed.refresh()  # the first setData of 6 x n points (the timer's slot, called directly)
    set_data_ms = (time.perf_counter() - t0) * 1000.0
    board = panel.loss_plot
    views = [plot.view for plot in (board.generator, board.critic)]
    page = board.tabs.currentWidget()

    def frame(x0: float, x1: float) -> float:
        t = time.perf_counter()
        for view in views:
            view.setXRange(x0, x1, padding=0)  # pyqtgraph re-clips and re-downsamples here, synchronously
        page.grab()  # one full paint of both plots (axes, legends, 6 curves)
        return (time.perf_counter() - t) * 1000.0

    full = [frame(0, n_points + (i % 2)) for i in range(frames)]
    width = n_points / 10
    pans = [frame(s, s + width) for s in np.linspace(0, n_points - width, frames)]
    panel.close()
    return {"points_per_curve": n_points, "curves": len(LOSSES), "first_set_data_ms": set_data_ms,
            "frame_full_median_ms": statistics.median(full), "frame_full_p95_ms": pct(full, 95),
            "frame_pan_median_ms": statistics.median(pans), "frame_pan_p95_ms": pct(pans, 95)}


# ---------------------------------------------------------------- d: start to window

_START = r'''
import sys, time, tempfile
from pathlib import Path
sys.path.insert(0, {repo!r})
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
tmp = Path(tempfile.mkdtemp())
if {what!r} == "window":
    from app.window import MainWindow
    w = MainWindow(QSettings(str(tmp / "s.ini"), QSettings.IniFormat), runs_root=tmp / "runs")
else:
    from app.panels.training import TrainingPanel
    w = TrainingPanel()
w.resize(1280, 800)
w.show()
QTimer.singleShot(0, lambda: (print("shown", time.time(), flush=True), app.quit()))
app.exec()
'''


def bench_start(what: str, repeats: int) -> dict:
    times, error = [], ""
    for _ in range(repeats):
        t0 = time.time()
        p = subprocess.run([sys.executable, "-c", _START.format(repo=str(REPO), what=what)], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        shown = [line for line in p.stdout.splitlines() if line.startswith("shown ")]
        if p.returncode != 0 or not shown:
            error = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            break
        times.append(float(shown[-1].split()[1]) - t0)
    if not times:
        return {f"start_{what}_s": float("nan"), f"start_{what}_error": error}
    return {f"start_{what}_s": statistics.median(times), f"start_{what}_max_s": max(times)}


# ---------------------------------------------------------------- report

def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        from dmad.train.env import cpu_name  # torch-free? fall back quietly when not
        cpu = cpu_name()
    except Exception:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, " \
           f"Qt platform {QApplication.platformName()}, Python {platform.python_version()}"


def table(r: dict) -> str:
    rows = [
        ("a", "event written -> point plotted p50 / p95 / max (ms)",
         f"{r['latency_p50_ms']:.1f} / {r['latency_p95_ms']:.1f} / {r['latency_max_ms']:.1f}",
         f"p95 <= {TARGETS['latency_p95_ms']:.0f}", r["latency_p95_ms"] <= TARGETS["latency_p95_ms"]),
        ("b", "GUI-thread stall p99 / max (ms)", f"{r['stall_p99_ms']:.1f} / {r['stall_max_ms']:.1f}",
         f"p99 <= {TARGETS['stall_p99_ms']:.0f}", r["stall_p99_ms"] <= TARGETS["stall_p99_ms"]),
        ("c", f"frame, {r['curves']} x {r['points_per_curve']:,} points, full view median / p95 (ms)",
         f"{r['frame_full_median_ms']:.1f} / {r['frame_full_p95_ms']:.1f}", f"<= {TARGETS['frame_ms']:.0f}",
         r["frame_full_p95_ms"] <= TARGETS["frame_ms"]),
        ("c", "frame, pan of a 10 % window median / p95 (ms)",
         f"{r['frame_pan_median_ms']:.1f} / {r['frame_pan_p95_ms']:.1f}", f"<= {TARGETS['frame_ms']:.0f}",
         r["frame_pan_p95_ms"] <= TARGETS["frame_ms"]),
        ("d", "app start to main window shown (s)", f"{r['start_window_s']:.2f}", f"<= {TARGETS['start_s']:.0f}",
         r["start_window_s"] <= TARGETS["start_s"]),
        ("d", "start to Training panel alone shown (s)", f"{r['start_panel_s']:.2f}", "", None),
    ]
    lines = [f"{'':2} {'measure':<62} {'result':>24}  {'target':<9} met"]
    for key, name, value, target, ok in rows:
        lines.append(f"{key:2} {name:<62} {value:>24}  {target:<9} {'' if ok is None else ('yes' if ok else 'NO')}")
    lines.append(f"events written {r['events_written']}, points plotted {r['points_plotted']}; "
                 f"first setData of 6 x 1M points {r['first_set_data_ms']:.0f} ms")
    for k in ("start_window_error", "start_panel_error"):
        if k in r:
            lines.append(f"{k}: {r[k]}")
    lines.append(f"machine: {r['machine']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 s live run, 100,000 points, 1 start (a smoke run)")
    p.add_argument("--seconds", type=float, default=None, help="length of the live run (default 20; --quick 5)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = p.parse_args(argv)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    result = {"machine": machine(), "seconds": seconds, "rate_hz": RATE_HZ}
    result.update(bench_live(app, seconds))
    result.update(bench_frames(app, 100_000 if args.quick else 1_000_000, frames=10 if args.quick else 30))
    for what in ("window", "panel"):
        result.update(bench_start(what, 1 if args.quick else 3))
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
