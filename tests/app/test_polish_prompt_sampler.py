"""The prompt-set editor says which sampler a run's teacher really renders with (issue 42 polish): it
showed "ddim" for a run whose teacher rendered with flow_match_euler (a flow-matching family, SD3 /
Flux, always samples with its own). The file keeps the set's sampler unless the user edits it. No torch."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.dialogs.prompt_set_editor import FLOW_SAMPLER, PromptSetEditor, family_sampler
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.widgets.samples_grid import scan_grid
from tests.app.test_prompt_set_editor import DEMO, _set_cell


@pytest.fixture
def folder(tmp_path) -> Path:
    f = tmp_path / "sets"
    f.mkdir()
    shutil.copy(DEMO, f / "demo_v1.json")
    return f


@pytest.mark.parametrize("family, meta, expected", [
    ("sd3", {}, FLOW_SAMPLER), ("flux", {"sampler": "ddim"}, FLOW_SAMPLER),  # the config names a flow family
    ("auto", {"sampler": FLOW_SAMPLER}, FLOW_SAMPLER),  # found at run time: the teacher's meta.json says
    ("auto", {"sampler": "ddim"}, None), ("auto", {}, None), (None, None, None),
    ("sdxl", {"sampler": "euler"}, None), ("sd1", {}, None),
])
def test_the_familys_own_sampler(family, meta, expected):
    assert family_sampler(family, meta) == expected


def test_a_flow_run_shows_its_own_sampler_and_the_file_keeps_the_sets(qtbot, folder):
    editor = PromptSetEditor(folder, own_sampler=FLOW_SAMPLER)
    qtbot.addWidget(editor)
    editor.load_file(folder / "demo_v1.json")
    assert json.loads(DEMO.read_text())["sampler"] == "ddim"
    assert editor.sampler.isHidden() and not editor.own_sampler_box.isHidden()
    assert not editor.own_sampler_box.isEnabled()
    assert editor.own_sampler_box.text() == "flow_match_euler (the family's own)"
    assert "flow-matching" in editor.own_sampler_box.toolTip() and '"ddim"' in editor.own_sampler_box.toolTip()
    assert editor.raw()["sampler"] == "ddim" and not editor.is_edited()
    _set_cell(editor, 0, "prompt", "a large red circle, slightly left")
    path = editor.save()
    assert path == folder / "demo_v2.json" and json.loads(path.read_text())["sampler"] == "ddim"


def test_a_run_of_another_family_shows_the_sets_sampler(qtbot, folder):
    editor = PromptSetEditor(folder)
    qtbot.addWidget(editor)
    editor.load_file(folder / "demo_v1.json")
    assert not editor.sampler.isHidden() and editor.own_sampler_box.isHidden()
    assert editor.sampler.currentText() == "ddim"


def test_the_listing_tells_the_family_from_the_config_or_the_teachers_samples(tmp_path):
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")  # model_family "auto", teacher rendered with ddim
    listing = scan_grid(run)
    assert listing.model_family == "auto" and listing.teacher_meta()["sampler"] == "ddim"
    assert family_sampler(listing.model_family, listing.teacher_meta()) is None
    meta_path = run / "samples" / "teacher" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "sampler": FLOW_SAMPLER}))
    listing = scan_grid(run)  # an "auto" teacher that turned out to be SD3 / Flux
    assert family_sampler(listing.model_family, listing.teacher_meta()) == FLOW_SAMPLER
    config = json.loads((run / "config.json").read_text())
    config["identity"]["model_family"] = "flux"
    (run / "config.json").write_text(json.dumps(config))
    shutil.rmtree(run / "samples" / "teacher")  # before the teacher has rendered: the config says
    listing = scan_grid(run)
    assert listing.model_family == "flux" and listing.teacher_meta() == {}
    assert family_sampler(listing.model_family, listing.teacher_meta()) == FLOW_SAMPLER
