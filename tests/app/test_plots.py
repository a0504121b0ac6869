"""The Training panel's plots, driven through the real widgets (PlotBoard, MetricPlot): what a
person reading them sees — separate plots, legends that hide series, hover values, honest ranges,
other runs overlaid, the wall-clock axis, export. No torch; recorded run folders from fixtures/."""
from __future__ import annotations

import csv
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QPointF, Qt
from PySide6.QtGui import QImage, QMouseEvent
from PySide6.QtWidgets import QApplication

from app.models.series import SeriesStore
from app.panels.training import TrainingPanel
from app.models.health import SIGNALS
from app.widgets.plot_board import PlotBoard
from app.widgets.plot_specs import DEVICE_USED
from dmad.contract.events import make_event
from dmad.contract.runs import RunFolder, atomic_write_json

WAIT_MS = 30_000  # generous: the machine is shared; nothing here is a timing test
FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_700_000_000.0


def metric(it: int, **extra) -> dict:
    """One iteration's metric event data as the engine writes it; generator terms every 3rd iteration."""
    data = {"loss_fake": 0.1 + 0.01 * it, "loss_d_gan": 1.4, "loss_c": 0.11 + 0.01 * it, "d_real_acc": 0.75,
            "d_fake_acc": 0.25, "grad_norm_c": 0.4, "step_time_s": 0.5, "data_time_s": 0.01,
            "mem_peak_alloc_gb": None, "mem_device_used_gb": 0.855 + 0.001 * (it % 30),
            "lr_generator": 1e-4, "lr_critic": 2e-5}
    if it % 3 == 0:
        data.update(loss_dm=1.0 / it, loss_g_gan=0.7, loss_g=1.0 / it + 7e-4, grad_norm_g=1.2, dm_grad_norm=0.8)
    data.update(extra)
    return data


def fill(store: SeriesStore, iters, **extra) -> set[str]:
    for it in iters:
        store.add_metric(it, metric(it, **extra), t=T0 + 2.0 * it)
    return store.take_dirty()


@pytest.fixture
def board(qtbot):
    b = PlotBoard()
    qtbot.addWidget(b)
    b.resize(1280, 700)
    b.show()
    qtbot.waitExposed(b)
    return b


def fed(board: PlotBoard, iters=range(1, 31), **extra) -> SeriesStore:
    store = SeriesStore()
    board.refresh(store, fill(store, iters, **extra))
    return store


def y_range(plot) -> list[float]:
    return list(plot.view.viewRange()[1])


def n_points(curve) -> int:
    x, _ = curve.getData()
    return 0 if x is None else len(x)


def hover(plot, x: float) -> None:
    """A real mouse move over the plot at data x (the scene emits sigMouseMoved from it)."""
    (_, _), (y0, y1) = plot.view.viewRange()
    scene = plot.view.mapViewToScene(QPointF(x, (y0 + y1) / 2))
    at = QPointF(plot.widget.mapFromScene(scene))
    viewport = plot.widget.viewport()
    ev = QMouseEvent(QEvent.MouseMove, at, QPointF(viewport.mapToGlobal(at.toPoint())), Qt.NoButton, Qt.NoButton,
                     Qt.NoModifier)
    QApplication.sendEvent(viewport, ev)


# ---------------------------------------------------------------- which plot shows what

def test_each_group_has_its_own_plot_with_distinct_2px_colours(qtbot, board):
    fed(board)
    board.tabs.setCurrentIndex(1)  # the second page draws what waited while it was hidden
    expected = {"generator": ["loss_dm", "loss_g_gan", "loss_g"], "critic": ["loss_fake", "loss_d_gan", "loss_c"],
                "lcm": [], "accuracy": ["d_real_acc", "d_fake_acc"], "gradients": ["grad_norm_g", "grad_norm_c", "dm_grad_norm"],
                "lr": ["lr_generator", "lr_critic"], "memory": ["mem_device_used_gb"],
                "step_time": ["step_time_s", "data_time_s"],
                **{f"health_{s}": [] for s in SIGNALS}}  # the Health page: no health rows fed here
    assert {p.spec.name: p.keys_with_data() for p in board.plots()} == expected
    for plot in board.plots():
        pens = [plot.curve(k).opts["pen"] for k in plot.curve_keys()]
        assert all(pg_pen.widthF() >= 2 for pg_pen in pens)
        assert len({pen.color().name() for pen in pens}) == len(pens)  # no two series alike
    generator, accuracy = board.plot_named("generator"), board.plot_named("accuracy")
    assert "loss_dm + w_g·loss_g_gan" in " ".join(generator.legend.labels())  # why loss_g lies on loss_dm
    assert "every K-th iteration" in generator.getPlotItem().getAxis("bottom").labelText  # why it ends early
    x, y = accuracy.curve("d_real_acc").getData()
    assert list(x) == list(range(1, 31)) and set(y) == {0.75}
    assert list(board.gradients.curve("dm_grad_norm").getData()[0]) == list(range(3, 31, 3))
    assert list(board.lr.curve("lr_critic").getData()[1]) == [2e-5] * 30
    qtbot.waitUntil(lambda: y_range(accuracy)[0] <= 0.0 and y_range(accuracy)[1] >= 1.0, timeout=WAIT_MS)
    assert y_range(accuracy)[1] < 1.1  # a fixed 0..1, not fitted to the 0.25 and 0.75 it shows


def test_a_hidden_page_is_drawn_when_chosen(qtbot, board):
    fed(board)
    assert board.plot_named("accuracy").keys_with_data() == []  # not drawn while nobody can see it
    board.tabs.setCurrentIndex(1)
    assert board.plot_named("accuracy").keys_with_data() == ["d_real_acc", "d_fake_acc"]


# ---------------------------------------------------------------- legend, hover

def test_clicking_a_legend_entry_hides_and_shows_its_series(qtbot, board):
    fed(board)
    generator = board.plot_named("generator")
    entry = generator.legend.entry("loss_g")
    curve = generator.curve("loss_g")
    assert entry.isVisible() and curve.isVisible()
    qtbot.mouseClick(entry, Qt.LeftButton)
    assert not curve.isVisible() and entry.font().strikeOut()
    assert generator.readout.show_at(9) and not any("loss_g =" in r for r in generator.readout.rows)
    qtbot.mouseClick(entry, Qt.LeftButton)
    assert curve.isVisible() and not entry.font().strikeOut()


def test_hovering_shows_every_shown_series_value(qtbot, board):
    fed(board)
    plot = board.plot_named("generator")
    qtbot.waitUntil(lambda: plot.view.viewRange()[0][1] >= 30, timeout=WAIT_MS)
    hover(plot, 12.2)
    qtbot.waitUntil(lambda: bool(plot.readout.rows), timeout=WAIT_MS)
    assert plot.readout.rows[0] == "iteration 12"
    assert plot.readout.rows[1:] == ["loss_dm  0.08333", "loss_g_gan  0.7", "loss_g = loss_dm + w_g·loss_g_gan + w_r·loss_reg  0.08403"]
    assert plot.readout.box.isVisible() and plot.readout.line.value() == 12
    QApplication.sendEvent(plot.widget.viewport(), QEvent(QEvent.Leave))
    assert not plot.readout.box.isVisible()
    critic = board.plot_named("critic")
    critic.readout.show_at(31.0)  # past the end: the last point, and where it is
    assert critic.readout.rows[0] == "iteration 30" and critic.readout.rows[1] == "loss_fake  0.4"


# ---------------------------------------------------------------- ranges

def test_memory_axis_starts_at_zero_and_reaches_the_device_total(qtbot, board):
    fed(board)
    mem = board.memory_plot
    qtbot.waitUntil(lambda: y_range(mem)[0] <= 0.0 and 0.884 <= y_range(mem)[1] < 0.95, timeout=WAIT_MS)
    mem.set_total(80.0)
    qtbot.waitUntil(lambda: y_range(mem)[1] >= 80.0, timeout=WAIT_MS)


def test_a_figure_the_device_lacks_has_no_legend_entry(qtbot, board):
    fed(board)  # mem_peak_alloc_gb is null on a CPU run
    assert board.memory_plot.legend.labels() == [DEVICE_USED]
    assert "n/a on CPU" in board.memory_plot.legend.note.text() and board.memory_plot.legend.note.isVisible()
    fed(board, mem_peak_alloc_gb=1.5)
    assert len(board.memory_plot.legend.labels()) == 2 and board.memory_plot.legend.note.isHidden()


def test_an_empty_plot_says_so_without_ticks(qtbot, board):
    for plot in board.plots():
        assert plot.is_empty() and plot.empty_text.isVisible()
        assert not plot.x_axis.style["showValues"] and not plot.y_axis.style["showValues"]
    fed(board, range(1, 5))
    critic = board.plot_named("critic")
    assert not critic.is_empty() and critic.y_axis.style["showValues"]


def test_one_point_gets_a_small_range_centred_on_it(qtbot, board):
    store = SeriesStore()
    store.add_metric(7, {"loss_fake": 2.0}, t=T0)
    board.refresh(store, store.take_dirty())
    plot = board.plot_named("critic")
    qtbot.waitUntil(lambda: not plot.is_empty() and plot.view.viewRange()[0][0] > 0, timeout=WAIT_MS)
    (x0, x1), (y0, y1) = plot.view.viewRange()
    assert x0 < 7 < x1 and x1 - x0 <= 3 and abs((x0 + x1) / 2 - 7) < 1e-6
    assert y0 < 2.0 < y1 and y1 - y0 <= 0.25 and abs((y0 + y1) / 2 - 2.0) < 1e-6
    assert plot.curve("loss_fake").opts["symbol"] == "o"  # a line through one point draws nothing
    store.add_metric(8, {"loss_fake": 2.5}, t=T0 + 1)
    board.refresh(store, store.take_dirty())
    assert plot.curve("loss_fake").opts["symbol"] is None


def test_every_plot_spans_the_same_iterations(qtbot, board):
    fed(board, range(1, 32))  # the generator's last point is 30, the critic's 31
    generator, critic = board.plot_named("generator"), board.plot_named("critic")
    qtbot.waitUntil(lambda: critic.view.viewRange()[0][1] >= 31, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: generator.view.viewRange()[0] == critic.view.viewRange()[0], timeout=WAIT_MS)


def test_a_new_run_starts_with_fresh_ranges_and_legend(qtbot, tmp_path, open_and_wait):
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    panel.resize(1280, 800)
    panel.show()
    big = write_run(tmp_path, "big", range(1, 301), scale=100.0)
    open_and_wait(panel, big.path)
    plot = panel.loss_plot.plot_named("critic")
    qtbot.waitUntil(lambda: n_points(plot.curve("loss_fake")) == 300, timeout=WAIT_MS)
    plot.view.setRange(xRange=(100, 200), yRange=(5, 50))  # the user zoomed in: auto-range is off
    qtbot.mouseClick(plot.legend.entry("loss_c"), Qt.LeftButton)  # and hid a series
    small = write_run(tmp_path, "small", range(1, 11), scale=1.0)
    open_and_wait(panel, small.path)
    qtbot.waitUntil(lambda: n_points(plot.curve("loss_fake")) == 10, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: plot.view.viewRange()[0][1] < 12, timeout=WAIT_MS)
    (x0, x1), (y0, y1) = plot.view.viewRange()
    assert 0 <= x0 < 1 and y1 < 2.0 and plot.curve("loss_c").isVisible()


def test_log_tick_labels_never_overlap(qtbot):
    """pyqtgraph labels every 2..9 x 10^k under three decades: near a decade's top they overlapped."""
    import pyqtgraph as pg
    from PySide6.QtGui import QPainter
    from app.widgets.plot_axis import PlotAxis
    axis = PlotAxis("left")
    plot = pg.PlotWidget(axisItems={"left": axis})
    qtbot.addWidget(plot)
    plot.setLogMode(y=True)
    plot.show()
    img = QImage(10, 10, QImage.Format_ARGB32)
    for height in (150, 250, 500):
        plot.resize(300, height)
        qtbot.waitUntil(lambda: abs(axis.height() - (height - 40)) < 40, timeout=WAIT_MS)
        for lo, hi in ((0.06, 1.5), (0.5, 1.2), (1e-3, 2.0), (1e-9, 1e3), (0.95, 1.02)):
            plot.setYRange(np.log10(lo), np.log10(hi), padding=0)
            axis.setRange(np.log10(lo), np.log10(hi))
            painter = QPainter(img)
            _, _, texts = axis.generateDrawSpecs(painter)
            painter.end()
            rects = sorted((r for r, _, _ in texts), key=lambda r: r.top())
            case = (lo, hi, height, [t for *_, t in texts])
            assert 2 <= len(texts) <= axis.height() / 15, case
            assert all(a.bottom() <= b.top() for a, b in zip(rects, rects[1:])), case


# ---------------------------------------------------------------- x axis, smoothing

def test_the_x_axis_switches_to_wall_clock_time(qtbot, board):
    store = fed(board)
    board.x_axis.setCurrentIndex(board.x_axis.findData("elapsed"))
    board.refresh(store, set(store.names()))  # what the panel's feed does on display_changed
    x, _ = board.plot_named("critic").curve("loss_fake").getData()
    assert list(x) == [2.0 * (it - 1) for it in range(1, 31)]  # seconds since the first metric event
    assert board.plot_named("critic").getPlotItem().getAxis("bottom").labelText == "elapsed wall-clock time"
    assert board.plot_named("generator").getPlotItem().getAxis("bottom").labelText.startswith("elapsed wall-clock time · ")
    assert board.plot_named("critic").x_axis.tickStrings([0, 30, 90, 3900], 1, 30) == ["0s", "30s", "1m30s", "1h05m"]
    board.plot_named("critic").readout.show_at(20.0)
    assert board.plot_named("critic").readout.rows[0] == "20s · iteration 11"
    board.set_x_mode("iteration")
    board.refresh(store, set(store.names()))
    assert list(board.plot_named("critic").curve("loss_fake").getData()[0]) == list(range(1, 31))


def test_smoothing_follows_new_points_incrementally(qtbot, board):
    from app.widgets.plots import ema
    store = fed(board, range(1, 21))
    board.set_smoothing(0.8)
    board.refresh(store, set(store.names()))
    board.refresh(store, fill(store, range(21, 41)))
    raw = np.array([0.1 + 0.01 * it for it in range(1, 41)])
    _, y = board.plot_named("critic").curve("loss_fake").getData()
    assert list(y) == pytest.approx(list(ema(raw, 0.8)))
    board.tabs.setCurrentIndex(1)
    assert list(board.lr.curve("lr_critic").getData()[1]) == [2e-5] * 40  # learning rates are never smoothed


# ---------------------------------------------------------------- other runs

def test_another_run_is_overlaid_dashed_and_removed(qtbot, board):
    fed(board)
    demo = FIXTURES / "demo_run"
    board.add_overlay_dir(demo)
    qtbot.waitUntil(lambda: board.overlay_names() == ["demo_run"], timeout=WAIT_MS)
    with open(demo / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    want = [int(r["iter"]) for r in rows if r["loss_dm"]]
    curves = board.plot_named("generator").overlay_curves("demo_run")
    assert set(curves) == {"loss_dm", "loss_g_gan", "loss_g"}
    assert curves["loss_dm"].opts["pen"].style() == Qt.DashLine
    assert list(curves["loss_dm"].getData()[0]) == want
    assert "demo_run (dashed)" in board.plot_named("generator").legend.labels()
    assert board.memory_plot.overlay_curves("demo_run") == {}  # another machine's memory is not comparable
    board.plot_named("generator").readout.show_at(6.0)
    assert any(r.startswith("loss_dm · demo_run") for r in board.plot_named("generator").readout.rows)
    board.remove_overlay("demo_run")
    assert board.overlay_names() == [] and board.plot_named("generator").overlay_curves("demo_run") == {}
    assert all(c.getViewBox() is None for c in curves.values())  # gone from the plot, not just hidden
    assert "demo_run (dashed)" not in board.plot_named("generator").legend.labels()


def test_a_folder_without_metrics_is_refused_in_one_line(qtbot, board, tmp_path):
    board.add_overlay_dir(tmp_path)
    qtbot.waitUntil(lambda: "could not compare" in board.status.text(), timeout=WAIT_MS)
    assert board.overlay_names() == [] and "no metrics.csv rows" in board.status.text()


# ---------------------------------------------------------------- export

def test_export_writes_a_png_and_a_csv(qtbot, board, tmp_path):
    fed(board)
    plot = board.plot_named("generator")
    plot.export_png(tmp_path / "gen.png")
    plot.export_csv(tmp_path / "gen.csv")
    qtbot.waitUntil(lambda: not plot.exporter.busy(), timeout=WAIT_MS)
    image = QImage(str(tmp_path / "gen.png"))
    assert not image.isNull() and image.width() == plot.width()
    with open(tmp_path / "gen.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["iter", "elapsed_s", "loss_dm", "loss_g_gan", "loss_g"]
    assert [r[0] for r in rows[1:]] == [str(it) for it in range(3, 31, 3)]
    assert rows[1][1:3] == ["4.0", repr(1.0 / 3)]
    assert not list(tmp_path.glob("*.partial"))


def write_run(root: Path, name: str, iters, scale: float) -> RunFolder:
    run = RunFolder.create(root / name)
    atomic_write_json(run.config_json, {"config_version": 1})
    lines = [make_event("started", None, run_dir=str(run.path), max_train_steps=max(iters))]
    lines += [make_event("metric", it, loss_fake=scale * (1 + 0.001 * it), loss_c=scale * 1.01, max_train_steps=max(iters))
              for it in iters]
    run.events_jsonl.write_text("".join(ev.to_line() + "\n" for ev in lines))
    atomic_write_json(run.status_json, {"state": "finished", "pid": os.getpid(), "host": socket.gethostname(),
                                        "heartbeat": time.time()})
    return run


def test_read_overlay_keeps_only_increasing_finite_rows(tmp_path):
    from app.models.plot_data import read_overlay
    (tmp_path / "metrics.csv").write_text("iter,loss_dm,loss_c\n2,0.5,\n4,,0.1\n4,0.4,0.2\n6,0.3,0.3\n")
    run = read_overlay(tmp_path)
    assert {k: (list(x), list(y)) for k, (x, y) in run.series.items()} == {
        "loss_dm": ([2.0, 4.0, 6.0], [0.5, 0.4, 0.3]), "loss_c": ([4.0, 6.0], [0.1, 0.3])}
    assert len(run.times[0]) == 0  # no events.jsonl: no wall-clock axis for it


def test_a_recorded_run_overlay_has_its_event_times():
    from app.models.plot_data import read_overlay
    run = read_overlay(FIXTURES / "demo_run")  # read only
    assert len(run.times[0]) == 60 and np.all(np.diff(run.times[1]) > 0)
    assert len(run.series["loss_c"][0]) == 60 and len(run.series["loss_dm"][0]) == 24  # rows with a student step
    assert "mem_peak_alloc_gb" not in run.series  # an empty column is no curve


def test_the_panel_redraws_a_recorded_run_on_the_wall_clock_axis(qtbot, tmp_path, open_and_wait):
    from app.screenshots import prepare_recorded_run
    from dmad.contract.events import read_events
    run = prepare_recorded_run(FIXTURES / "demo_run", tmp_path)
    times = [ev.t for ev in read_events(run / "events.jsonl") if ev.kind == "metric"]
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    open_and_wait(panel, run)
    critic = panel.loss_plot.plot_named("critic")
    qtbot.waitUntil(lambda: n_points(critic.curve("loss_c")) == 60, timeout=WAIT_MS)
    panel.loss_plot.x_axis.setCurrentIndex(panel.loss_plot.x_axis.findData("elapsed"))  # through the feed
    qtbot.waitUntil(lambda: critic.curve("loss_c").getData()[0][-1] > 1000, timeout=WAIT_MS)
    x, _ = critic.curve("loss_c").getData()
    assert x[0] == 0 and x[-1] == pytest.approx(times[-1] - times[0])
