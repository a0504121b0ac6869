"""The Data tab's bucket histogram (issue 42 polish): its bars add up to every image checked (an image
whose size the engine could not read is in no bucket: it was silently missing, "29 of 30"; now a
"no size" bar with its reason), and its legend sits above the plot area, never over a bar. The first
test runs the engine's own `dmad check-data` (torch-free) on a real folder."""
from __future__ import annotations

import shutil

import pyqtgraph as pg

from app.models.thumbs import ThumbCache
from app.panels.data import DataPanel
from app.widgets.bucket_plot import NO_SIZE, BucketPlot
from tests.app.test_data_panel import StandIn, make_report, panel_for, run_check
from tests.conftest import REPO

SHAPES = REPO / "resources" / "demo" / "shapes"


def _bar_total(plot: BucketPlot) -> int:
    return int(sum(plot.images_bars.opts["height"]))


def test_an_image_without_a_size_is_counted_and_says_why(qtbot, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for png in sorted(SHAPES.glob("img_*.png"))[:29]:
        shutil.copy(png, data / png.name)
        shutil.copy(png.with_suffix(".txt"), data / png.with_suffix(".txt").name)
    (data / "broken.png").write_bytes(b"not an image at all")
    (data / "broken.txt").write_text("a broken image")
    panel = DataPanel(cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "data"}, "resources": {"resolution": 64}}, tmp_path)
    panel.min_size.setValue(64)
    code, line = run_check(qtbot, panel)
    assert code == 1, line  # the broken image is an error
    report = panel.report()
    assert report.images == 30 and sum(b["images"] for b in report.buckets) == 29  # the engine's buckets
    plot = panel.buckets
    assert _bar_total(plot) == 30 and plot.labels() == ["64x64", NO_SIZE] and plot.no_size == 1
    assert list(plot.usable_bars.opts["height"]) == [29, 0]
    assert plot.toolTip().startswith("1 of 30 images in no bucket") and "image_corrupt (1)" in plot.toolTip()


def test_every_image_in_a_bucket_has_no_extra_bar(qtbot, tmp_path):
    folder = tmp_path / "cfg" / "data"
    folder.mkdir(parents=True)
    stand_in = StandIn(tmp_path / "standin", report=make_report(folder, usable=5, images=20))  # 12 + 8 bucketed
    panel = panel_for(qtbot, tmp_path, stand_in, folder)
    run_check(qtbot, panel)
    assert panel.buckets.labels() == ["64x64", "64x128"] and _bar_total(panel.buckets) == 20
    assert panel.buckets.no_size == 0 and panel.buckets.toolTip() == ""


def test_the_legend_is_outside_the_plot_area(qtbot):
    plot = BucketPlot()
    qtbot.addWidget(plot)
    plot.resize(400, 300)
    plot.set_buckets([{"width": 64, "height": 64, "images": 256, "usable": 256}], 256, {})
    plot.show()
    qtbot.waitExposed(plot)
    item = plot.getPlotItem()
    area = item.vb.sceneBoundingRect()
    assert not [c for c in item.vb.childItems() if isinstance(c, pg.LegendItem)]  # none inside the view box
    legend = item.titleLabel
    assert legend.isVisible() and "images" in legend.text and "usable" in legend.text
    assert legend.sceneBoundingRect().bottom() <= area.top()
    top_of_bar = item.vb.mapViewToScene(pg.Point(0, 256)).y()
    assert area.top() < top_of_bar  # the tallest bar ends inside the plot area, below the legend
