"""Issue 39, app side: the Training panel's Health page (history from health.csv, live health events),
the alert banner and its one notification per new alert. Fixture run folders are written here as the
contract says (tests/app/health_fixtures.py). No torch."""
from __future__ import annotations

import pytest

from app.panels.training import TrainingPanel
from dmad.contract.runlog import HEALTH_THRESHOLDS
from app.widgets.run_notifier import HEALTH_ALERT, RunNotifier
from tests.app.health_fixtures import alert, csv_row, health_event, health_kind, signals, write_health_csv  # noqa: F401
from tests.app.test_training_panel import WAIT_MS, append, write_run


@pytest.fixture
def panel(qtbot):
    p = TrainingPanel()
    qtbot.addWidget(p)
    p.resize(1200, 800)
    return p


def plotted(panel: TrainingPanel, signal: str) -> tuple[list, list]:
    x, y = panel.loss_plot.plot_named("health_" + signal).curve("health." + signal).getData()
    return ([], []) if x is None else (list(x), [round(float(v), 4) for v in y])


def test_health_page_plots_the_csv_history_then_live_events(qtbot, panel, tmp_path, health_kind, open_and_wait):
    run = write_run(tmp_path, "live", state="running")
    write_health_csv(run.path, [csv_row(100, signals(0.95, 1.02, 0.9), "iter_100"),
                                csv_row(200, signals(0.80, 1.10, 0.85)),
                                csv_row(300, signals(0.50, 1.20, 0.80), "iter_300", alerts=("diversity",))])
    open_and_wait(panel, run.path)
    panel.loss_plot.tabs.setCurrentIndex(2)  # the Health page
    assert panel.loss_plot.tabs.tabText(2) == "Health"
    qtbot.waitUntil(lambda: len(plotted(panel, "diversity")[0]) == 3, timeout=WAIT_MS)
    assert plotted(panel, "diversity") == ([100, 200, 300], [0.95, 0.8, 0.5])
    div = panel.loss_plot.plot_named("health_diversity")
    assert list(div.teacher_line.getData()[1]) == [1.0, 1.0]  # the teacher's level
    assert list(div.early_line.getData()[1]) == [0.95, 0.95]  # the run's first health row
    assert div.alert_iterations() == [300.0]
    assert list(div.bound_line.getData()[1]) == [HEALTH_THRESHOLDS["diversity"][0]] * 2  # the alert bound
    low, high = HEALTH_THRESHOLDS["detail"]
    x, y = panel.loss_plot.plot_named("health_detail").bound_line.getData()
    assert list(y) == [low, low, high, high] and list(x) == [100.0, 300.0, 100.0, 300.0]  # two segments
    dist = panel.loss_plot.plot_named("health_teacher_distance")
    assert dist.teacher_line is None and list(dist.early_line.getData()[1]) == [0.1, 0.1]  # absolute: no 1.0
    assert panel.loss_plot.plot_named("health_saturation").alert_iterations() == []

    append(run, health_event(400, signals(0.45, 1.25, 0.8), alerts=(alert("diversity", 0.45, 400, 200),)).encode())
    qtbot.waitUntil(lambda: len(plotted(panel, "diversity")[0]) == 4, timeout=WAIT_MS)
    assert plotted(panel, "diversity")[1][-1] == 0.45
    assert div.alert_iterations() == [300.0, 400.0]
    assert list(div.teacher_line.getData()[0]) == [100.0, 400.0]  # the guides span the drawn x


def test_health_page_is_shown_for_every_method_and_says_no_data_without_health(qtbot, panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "old")  # a run from before issue 39: no health.csv, no health event
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: not panel.lifecycle.replaying, timeout=WAIT_MS)
    panel.feed.refresh()
    plots = panel.loss_plot.health_plots
    assert len(plots) == 7 and all(not p.isHidden() and p.is_empty() for p in plots)


def test_an_alert_raises_the_banner_and_exactly_one_notification(qtbot, panel, tmp_path, health_kind, open_and_wait):
    notifier = RunNotifier(panel.run_state, lambda text: None, panel)
    panel.health_alert.connect(notifier.notify_health)
    history = alert("saturation", 1.6, 100)  # an alert of the history: the banner, no notification
    run = write_run(tmp_path, "live", state="running",
                    tail=health_event(100, signals(saturation=1.6), alerts=(history,)).encode())
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: not panel.lifecycle.replaying, timeout=WAIT_MS)
    assert notifier.sent == [] and "saturation" in panel.health_banner.text()
    panel.health_banner.dismiss.click()
    assert panel.health_banner.isHidden()

    first = alert("diversity", 0.41, 3000, 2000)
    append(run, health_event(3000, signals(0.41), alerts=(first,)).encode())
    qtbot.waitUntil(lambda: len(notifier.sent) == 1, timeout=WAIT_MS)
    title, message = notifier.sent[0]
    assert title == HEALTH_ALERT and "live: diversity 41% of the teacher's at iteration 3,000" in message
    assert "falling since 2,000" in message and "GAN weight" in message
    assert not panel.health_banner.isHidden()
    assert "diversity 41%" in panel.health_banner.text() and "What to change" in panel.health_banner.text()
    # the same alert at the next rows: no new notification; the dismissed banner stays dismissed
    panel.health_banner.dismiss.click()
    append(run, health_event(4000, signals(0.38), alerts=(alert("diversity", 0.38, 4000, 2000),)).encode()
           + health_event(5000, signals(0.36), alerts=(alert("diversity", 0.36, 5000, 2000),)).encode())
    qtbot.waitUntil(lambda: len(panel.store.get("health.diversity")) == 4, timeout=WAIT_MS)
    assert len(notifier.sent) == 1 and panel.health_banner.isHidden()


def test_a_hostile_health_csv_never_raises_or_blocks(qtbot, panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "hostile")
    (run.path / "health.csv").write_text(
        "iter,checkpoint,diversity,saturation,alerts\n"  # missing columns
        "100,iter_100,1e999,0.9,diversity;nonsense\n"  # an infinite value, an unknown alert name
        "x,iter_200,0.5,0.5,\n"  # a bad iteration
        "300,iter_300,nan,banana,\n"
        "400,../../etc,0.7,1.1,", encoding="utf-8")  # an unfinished last row
    panel.loss_plot.tabs.setCurrentIndex(2)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: "health: health.csv" in panel.log_view.toPlainText(), timeout=WAIT_MS)
    panel.feed.refresh()
    assert plotted(panel, "saturation") == ([100], [0.9]) and plotted(panel, "diversity") == ([], [])
    line = next(line for line in panel.log_view.toPlainText().splitlines() if line.startswith("health:"))
    assert "1 row(s) without a valid iter skipped" in line and "no column brightness" in line
    assert panel.loss_plot.plot_named("health_diversity").alert_iterations() == []  # its value was not a number
