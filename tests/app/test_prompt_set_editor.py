"""The prompt-set editor: live validation with the engine's words, and the versioning rule (an edit
of v1 is saved as v2 in a new file; v1 keeps its bytes). No torch."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PySide6.QtWidgets import QTableWidgetItem

from app.dialogs.prompt_set_editor import ITEM_COLUMNS, PromptSetEditor, save_edited
from app.panels.samples import SamplesPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.models.thumbs import ThumbCache
from dmad.errors import UserInputError
from dmad.contract.prompts import to_json, validate_prompt_set
from tests.conftest import REPO

DEMO = REPO / "resources" / "prompt_sets" / "demo_v1.json"


@pytest.fixture
def folder(tmp_path) -> Path:
    f = tmp_path / "sets"
    f.mkdir()
    shutil.copy(DEMO, f / "demo_v1.json")
    return f


def _editor(qtbot, folder: Path, used=()) -> PromptSetEditor:
    editor = PromptSetEditor(folder, used)
    qtbot.addWidget(editor)
    return editor


def _set_cell(editor: PromptSetEditor, row: int, key: str, text: str) -> None:
    editor.items.setItem(row, ITEM_COLUMNS.index(key), QTableWidgetItem(text))


def test_loading_shows_the_set_unchanged_and_valid(qtbot, folder):
    editor = _editor(qtbot, folder)
    editor.load_file(folder / "demo_v1.json")
    raw = json.loads(DEMO.read_text())
    assert editor.raw() == to_json(validate_prompt_set(editor.raw()))  # the file form: unset fields left out
    assert editor.items.rowCount() == len(raw["items"]) and not editor.is_edited()
    assert editor.save_button.isEnabled() and editor.message.text() == "Valid."


def test_editing_v1_and_saving_creates_v2_and_leaves_v1_untouched(qtbot, folder):
    v1_bytes = (folder / "demo_v1.json").read_bytes()
    editor = _editor(qtbot, folder)
    editor.load_file(folder / "demo_v1.json")
    _set_cell(editor, 0, "prompt", "a large red circle, slightly left")
    assert editor.is_edited() and "new version" in editor.message.text()
    with qtbot.waitSignal(editor.saved) as sig:
        path = editor.save()
    assert path == folder / "demo_v2.json" == sig.args[0]
    saved = json.loads(path.read_text())
    assert saved["version"] == "v2" and saved["items"][0]["prompt"] == "a large red circle, slightly left"
    assert (folder / "demo_v1.json").read_bytes() == v1_bytes
    assert editor.version.text() == "v2" and not editor.is_edited()  # the editor now shows v2
    _set_cell(editor, 1, "seed", "42")
    assert editor.save() == folder / "demo_v3.json"  # a further edit: v3, never over v2
    assert (folder / "demo_v1.json").read_bytes() == v1_bytes


def test_a_set_used_by_a_run_is_a_taken_version_even_when_the_folder_lacks_it(qtbot, tmp_path):
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    panel = SamplesPanel(cache=ThumbCache(tmp_path / "thumbs"), prompt_set_dir=tmp_path / "mine")
    qtbot.addWidget(panel)
    panel.set_run(run)
    qtbot.waitUntil(lambda: panel.buttons["prompts"].isEnabled(), timeout=5000)  # the listing is read in a worker
    editor = panel.edit_prompt_set()
    run_bytes = (run / "prompt_set.json").read_bytes()
    assert editor.name.text() == "demo" and editor.version.text() == "v1"
    _set_cell(editor, 2, "topic", "colour-edited")
    path = editor.save()
    assert path == tmp_path / "mine" / "demo_v2.json"
    assert (run / "prompt_set.json").read_bytes() == run_bytes  # the run's copy is never written
    editor.close()


def test_an_unsafe_id_shows_the_engines_message_and_disables_save(qtbot, folder):
    editor = _editor(qtbot, folder)
    editor.load_file(folder / "demo_v1.json")
    _set_cell(editor, 0, "id", "../x")
    with pytest.raises(UserInputError) as e:
        validate_prompt_set(editor.raw(), "prompt set")
    assert editor.message.text() == str(e.value)
    assert "must not contain a path separator" in editor.message.text()
    assert not editor.save_button.isEnabled() and editor.save_button.toolTip() == str(e.value)
    _set_cell(editor, 0, "id", "fine-id")
    assert editor.save_button.isEnabled() and editor.problem() == ""


@pytest.mark.parametrize("change, words", [
    (lambda e: e.width_box.setValue(100), "multiple of 8"),
    (lambda e: e.seed.setText("seven"), "seed"),
    (lambda e: [e.items.removeRow(0) for _ in range(e.items.rowCount())], "at least one item"),
    (lambda e: _set_cell(e, 1, "id", e.items.item(0, 0).text()), "duplicate item ids"),
])
def test_other_invalid_edits_disable_save(qtbot, folder, change, words):
    editor = _editor(qtbot, folder)
    editor.load_file(folder / "demo_v1.json")
    change(editor)
    assert words in editor.message.text() and not editor.save_button.isEnabled()


def test_saving_an_unedited_set_writes_nothing(folder):
    raw = json.loads(DEMO.read_text())
    before = sorted(p.name for p in folder.iterdir())
    assert save_edited(raw, folder, [raw]) == folder / "demo_v1.json"
    assert sorted(p.name for p in folder.iterdir()) == before


def test_an_edit_of_a_runs_later_version_comes_after_every_known_version(folder):
    """The folder holds demo v1; a run used demo v3 (not in the folder). Editing the run's v3 must
    save v4, not the folder's next (v2), which would sort before the set it came from."""
    run_v3 = {**json.loads(DEMO.read_text()), "version": "v3"}
    edited = {**run_v3, "seed": run_v3["seed"] + 1}
    assert save_edited(edited, folder, [run_v3]) == folder / "demo_v4.json"
    assert validate_prompt_set(json.loads((folder / "demo_v4.json").read_text())).version == "v4"
    # the run's v3 saved unedited keeps its own version
    assert save_edited(run_v3, folder, [run_v3]) == folder / "demo_v3.json"
    assert json.loads((folder / "demo_v1.json").read_text()) == json.loads(DEMO.read_text())


def test_keys_the_form_does_not_show_are_kept(qtbot, tmp_path):
    # demo_v4's health_seeds has no field in the editor: an edited and saved set must still carry it
    source = REPO / "resources" / "prompt_sets" / "demo_v4.json"
    raw = json.loads(source.read_text())
    assert raw.get("health_seeds")
    editor = PromptSetEditor(tmp_path, [])
    qtbot.addWidget(editor)
    editor.load_file(source)
    assert not editor.is_edited() and editor.raw()["health_seeds"] == raw["health_seeds"]
    editor.steps.setValue(editor.steps.value() + 1)
    assert editor.is_edited() and editor.raw()["health_seeds"] == raw["health_seeds"]
