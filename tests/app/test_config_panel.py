"""The Config panel: a form generated from the engine's schema, validated as you type with the
engine's own messages, a JSON view kept in sync both ways, presets, save / materialize with
relative paths kept meaningful, and the engine's dry run. No torch is imported here (the dry run
spawns the real CLI, which imports it in its own process)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox, QFileDialog, QLineEdit, QMessageBox

from app.models.config_doc import PATH_FIELDS, get_field, rebase_paths
from app.widgets.config_form import BoolEditor, EnumEditor, NullableEditor, TextEditor
from app.panels.config import ConfigInvalid, ConfigPanel
from app.models.presets import index_path, presets
from dmad.contract.config import TrainConfig, json_schema, load_config, resolve_paths, validate_config
from dmad.errors import UserInputError
from dmad.contract.jsonfile import read_json_file
from dmad.contract.paths import resource

DEMO = resource("configs", "demo.json")
DEMO_LCM = resource("configs", "demo_lcm.json")


@pytest.fixture
def panel(qtbot, tmp_path) -> ConfigPanel:
    p = ConfigPanel(unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(p)
    return p


def engine_message(raw: dict, source: str = "config") -> str:
    with pytest.raises(UserInputError) as e:
        validate_config(raw, source)
    return str(e.value)


def line(panel: ConfigPanel, group: str, name: str) -> QLineEdit:
    return panel.form.rows[(group, name)].editor.control()


def type_json(qtbot, panel: ConfigPanel, text: str, parses: bool = True) -> None:
    """Type into the JSON view and wait for its debounced parse."""
    with qtbot.waitSignal(panel.json.json_parsed if parses else panel.json.json_failed, timeout=None):
        panel.json.edit.setPlainText(text)


def schema_keys() -> list[tuple[str, ...]]:
    schema = json_schema()
    keys = []
    for name, prop in schema["properties"].items():
        if "$ref" not in prop:
            keys.append((name,))
            continue
        group = schema["$defs"][prop["$ref"].rsplit("/", 1)[-1]]
        for field, sub in group["properties"].items():
            if "$ref" in sub:  # a group in a group (observation.health): a row per field of it
                inner = schema["$defs"][sub["$ref"].rsplit("/", 1)[-1]]
                keys += [(name, field, f) for f in inner["properties"]]
            else:
                keys.append((name, field))
    return keys


def relative_config(folder: Path) -> Path:
    """A config whose every path field is relative to its own folder."""
    (folder / "teacher").mkdir(parents=True)
    (folder / "data").mkdir()
    path = folder / "configs" / "rel.json"
    path.parent.mkdir()
    path.write_text(json.dumps({
        "config_version": 1,
        "identity": {"pretrained_model_name_or_path": "../teacher", "train_data_dir": "../data",
                     "teacher_config_dir": "../teacher", "output_dir": "../runs"},
        "observation": {"prompt_set": "../prompts/p.json", "resume_from_checkpoint": "latest"},
    }, indent=2), encoding="utf-8")
    return path


# ------------------------------------------------------------ the form

def test_form_has_a_widget_for_every_schema_field_in_schema_order(panel):
    assert list(panel.form.rows) == schema_keys()
    titles = [box.title() for box in panel.form.findChildren(type(panel.form.rows[("identity", "student")]
                                                                   .parentWidget()))]
    assert titles[1:] == ["identity", "resources", "optimization", "distillation", "observation", "observation.health"]


def test_widgets_by_type_with_tooltips_from_the_schema(panel):
    rows = panel.form.rows
    assert isinstance(rows[("resources", "gradient_checkpointing")].editor, BoolEditor)
    assert isinstance(rows[("resources", "gradient_checkpointing")].editor.control(), QCheckBox)
    combo = rows[("resources", "mixed_precision")].editor.control()
    assert isinstance(combo, QComboBox) and [combo.itemText(i) for i in range(combo.count())] == ["no", "fp16", "bf16"]
    assert isinstance(rows[("optimization", "generator_lr")].editor, TextEditor)
    assert isinstance(rows[("distillation", "ema_decay")].editor, NullableEditor)
    assert isinstance(rows[("identity", "model_family")].editor, EnumEditor)
    tip = rows[("optimization", "generator_lr")].editor.toolTip()
    assert "Student learning rate." in tip and "range (0, 1]" in tip
    assert "range [1, 4096]" in rows[("resources", "train_batch_size")].editor.toolTip()


def test_form_shows_defaults_for_absent_keys_and_the_json_stays_sparse(panel):
    assert line(panel, "optimization", "adam_beta2").text() == "0.999"  # not in demo.json
    assert "adam_beta2" not in json.loads(panel.json.text())["optimization"]
    assert panel.form.rows[("identity", "run_name")].editor.none.isChecked()


# ------------------------------------------------------------ validation as you type

@pytest.mark.parametrize("group,name,bad,good", [("optimization", "generator_lr", "-1e-4", "2e-5"),
                                                 ("resources", "train_batch_size", "0", "2"),
                                                 ("resources", "resolution", "100", "96"),
                                                 ("resources", "seed", "abc", "7")])
def test_invalid_value_marks_the_field_with_the_engines_message(qtbot, panel, group, name, bad, good):
    assert panel.is_valid()
    with qtbot.waitSignal(panel.validity_changed) as signal:
        line(panel, group, name).setText(bad)
    expected = engine_message(panel.config())
    assert signal.args == [False, expected]
    assert f"{group}.{name}" in expected
    row = panel.form.rows[(group, name)]
    assert panel.form.error_of((group, name)) == expected and row.error.isVisibleTo(panel)
    assert "c62828" in row.editor.control().styleSheet() and expected in row.editor.toolTip()
    assert not panel.is_valid()

    with qtbot.waitSignal(panel.validity_changed) as signal:
        line(panel, group, name).setText(good)
    assert signal.args == [True, ""]
    assert get_field(panel.config(), (group, name)) == json.loads(good)
    assert panel.form.error_of((group, name)) == "" and row.editor.control().styleSheet() == ""


def test_cross_field_error_shows_at_the_top(qtbot, panel):
    with qtbot.waitSignal(panel.validity_changed) as signal:
        line(panel, "distillation", "min_timestep").setText("990")
    assert "min_timestep (990) must be below max_timestep (980)" in signal.args[1]
    assert signal.args[1] in panel.banner.text() and panel.banner.isVisibleTo(panel)
    assert panel.form.error_of(("distillation", "min_timestep")) == ""


def test_nullable_field_has_an_explicit_none(qtbot, panel):
    editor = panel.form.rows[("distillation", "ema_decay")].editor
    editor.none.setChecked(False)
    editor.inner.control().setText("0.999")
    assert panel.config()["distillation"]["ema_decay"] == 0.999 and panel.is_valid()
    editor.inner.control().setText("1.5")
    assert not panel.is_valid() and "distillation.ema_decay" in panel.validity_message()
    editor.none.setChecked(True)
    assert panel.config()["distillation"]["ema_decay"] is None and panel.is_valid()


def test_list_field_is_comma_separated(panel):
    editor = panel.form.rows[("distillation", "student_timesteps")].editor
    editor.none.setChecked(False)
    editor.inner.control().setText("999, 749, 499, 249")
    assert panel.config()["distillation"]["student_timesteps"] == [999, 749, 499, 249] and panel.is_valid()
    editor.inner.control().setText("999, 499")  # the demo has 4 student steps
    assert panel.validity_message() == engine_message(panel.config())
    assert "student_timesteps has 2 entries" in panel.banner.text()


def test_clearing_a_field_removes_the_key(panel):
    line(panel, "resources", "train_batch_size").setText("")
    assert "train_batch_size" not in panel.config()["resources"] and panel.is_valid()
    line(panel, "identity", "train_data_dir").setText("")
    assert panel.validity_message() == "config: missing required field 'identity.train_data_dir'"
    assert panel.form.error_of(("identity", "train_data_dir")) == panel.validity_message()


# ------------------------------------------------------------ the JSON view

def test_form_edit_rewrites_the_json_in_schema_order(panel):
    line(panel, "distillation", "real_guidance_scale").setText("4.5")
    panel.form.rows[("resources", "gradient_checkpointing")].editor.control().setChecked(True)
    text = panel.json.text()
    data = json.loads(text)
    assert data == panel.config() and data["resources"]["gradient_checkpointing"] is True
    assert data["distillation"]["real_guidance_scale"] == 4.5
    assert list(data) == ["config_version", "identity", "resources", "optimization", "distillation", "observation"]
    order = list(TrainConfig.model_fields["resources"].annotation.model_fields)
    assert list(data["resources"]) == [k for k in order if k in data["resources"]]
    assert text == json.dumps(data, indent=2) + "\n"


def test_json_edit_updates_the_form(qtbot, panel):
    raw = panel.config()
    raw["resources"]["train_batch_size"] = 3
    raw["optimization"]["generator_lr"] = 3e-5
    raw["resources"]["mixed_precision"] = "bf16"
    with qtbot.waitSignal(panel.config_edited, timeout=None):
        panel.json.edit.setPlainText(json.dumps(raw, indent=2))
    assert line(panel, "resources", "train_batch_size").text() == "3"
    assert line(panel, "optimization", "generator_lr").text() == "3e-05"
    assert panel.form.rows[("resources", "mixed_precision")].editor.control().currentText() == "bf16"
    assert panel.config() == raw and panel.is_valid()


def test_invalid_value_typed_in_the_json_marks_the_form_field(qtbot, panel):
    raw = panel.config()
    raw["resources"]["train_batch_size"] = 0
    type_json(qtbot, panel, json.dumps(raw))
    assert line(panel, "resources", "train_batch_size").text() == "0"
    assert panel.form.error_of(("resources", "train_batch_size")) == engine_message(raw)


def test_json_syntax_error_shows_line_and_column_and_leaves_the_form(qtbot, panel):
    before = panel.config()
    with qtbot.waitSignal(panel.validity_changed, timeout=None) as signal:
        panel.json.edit.setPlainText('{\n  "config_version": 1\n  "identity": {}\n}')
    assert signal.args == [False, "JSON: line 3, column 3: Expecting ',' delimiter"]
    assert panel.json.error.text() == "line 3, column 3: Expecting ',' delimiter"
    assert panel.config() == before and line(panel, "resources", "train_batch_size").text() == "8"
    with pytest.raises(ConfigInvalid, match="line 3, column 3"):
        panel.materialize()


def test_duplicate_key_is_rejected_as_the_engine_does(qtbot, panel, tmp_path):
    text = panel.json.text().replace('"train_batch_size": 8,', '"train_batch_size": 8,\n    "train_batch_size": 2,')
    type_json(qtbot, panel, text, parses=False)
    assert not panel.is_valid()
    assert panel.validity_message() == "JSON: duplicate key 'train_batch_size' (only one value can apply)"
    assert panel.config()["resources"]["train_batch_size"] == 8
    copy = tmp_path / "dup.json"
    copy.write_text(text, encoding="utf-8")
    with pytest.raises(UserInputError, match="duplicate key 'train_batch_size'"):
        read_json_file(copy, "config")


def test_enum_value_the_engine_rejects_is_shown_and_marked(qtbot, panel):
    raw = panel.config()
    raw["resources"]["mixed_precision"] = "fp8"
    type_json(qtbot, panel, json.dumps(raw))
    combo = panel.form.rows[("resources", "mixed_precision")].editor.control()
    assert combo.currentText() == '"fp8"'
    assert panel.form.error_of(("resources", "mixed_precision")) == engine_message(raw)
    raw["resources"]["mixed_precision"] = "bf16"
    type_json(qtbot, panel, json.dumps(raw))
    assert combo.currentText() == "bf16" and combo.count() == 3 and panel.is_valid()


def test_unknown_key_shows_the_engines_message_at_the_top(qtbot, panel):
    raw = panel.config()
    raw["resources"]["batch_size"] = 2
    type_json(qtbot, panel, json.dumps(raw))
    assert panel.validity_message() == engine_message(raw)
    assert "unknown key 'resources.batch_size'" in panel.banner.text()


# ------------------------------------------------------------ presets

def test_every_preset_validates_and_is_listed():
    listed = presets()
    names = [p.name for p in listed]
    assert names[0] == "CPU demo" and listed[0].path == DEMO.resolve()
    assert names[1] == "CPU demo \u2014 LCM (the peer method)" and listed[1].path == DEMO_LCM.resolve()
    assert names[2] == "Personal Lightning (demo)" and listed[2].path == resource("configs", "demo_personal_lightning.json")
    sizes = ["SD 1.5 \u2014 12 GB", "SD 1.5 \u2014 24 GB", "SD 1.5 \u2014 48 GB+", "SDXL \u2014 16 GB",
             "SDXL \u2014 24 GB", "SDXL \u2014 48 GB+", "SD3-medium \u2014 24 GB", "SD3-medium \u2014 48 GB+",
             "FLUX.1-dev \u2014 48 GB", "FLUX.1-dev \u2014 80 GB"]
    assert [n.split(" (")[0] for n in names[3:]] == sizes
    files = {p.resolve() for p in index_path().parent.glob("*.json")} - {index_path().resolve()}
    assert files <= {p.path for p in listed}
    for preset in listed:
        cfg = load_config(preset.path)
        assert preset.description
        if preset.name.startswith("SD 1.5"):  # the placeholder teacher: validation passes, preflight will not
            assert cfg.identity.pretrained_model_name_or_path.endswith("path/to/stable-diffusion-v1-5")
            assert not Path(cfg.identity.pretrained_model_name_or_path).exists()
            assert cfg.resources.resolution == 512 and cfg.identity.model_family == "sd1"
            assert "placeholder" in preset.description


# the family each large-model preset names, and its placeholder teacher (the ledger figures in their
# descriptions are checked against the engine in tests/engine/test_presets_ledger.py)
FAMILY_PRESETS = {"SDXL": ("sdxl", "path/to/stable-diffusion-xl-base-1.0"),
                  "SD3-medium": ("sd3", "path/to/stable-diffusion-3-medium-diffusers"),
                  "FLUX.1-dev": ("flux", "path/to/FLUX.1-dev")}


def test_family_presets_name_their_family_and_placeholder_teacher():
    seen = set()
    for preset in presets():
        prefix = preset.name.split(" \u2014 ")[0]
        if prefix not in FAMILY_PRESETS:
            continue
        family, placeholder = FAMILY_PRESETS[prefix]
        seen.add(prefix)
        raw = preset.load_raw()
        assert raw["identity"]["model_family"] == family  # explicit, never "auto"
        cfg = load_config(preset.path)
        assert cfg.identity.pretrained_model_name_or_path.endswith(placeholder)
        assert not Path(cfg.identity.pretrained_model_name_or_path).exists()
        assert placeholder in preset.description and "placeholder" in preset.description
        assert "ledger estimate" in preset.description
        assert cfg.resources.resolution == 1024 and cfg.distillation.student_steps == 4
    assert seen == set(FAMILY_PRESETS)


def test_presets_load_into_the_panel(panel):
    loaded = {}
    for preset in presets():
        assert panel.load_preset(preset)
        assert panel.doc.is_valid(), panel.validity_message()  # well formed (the GPU presets' paths are
        # placeholders, checked in tests/app/test_path_check.py)
        assert panel.doc.path is None and not panel.doc.is_modified()
        assert panel.base_dir() == preset.path.parent
        assert preset.name.split(" (")[0] in panel.file_label.text()
        loaded[preset.name.split(" (")[0]] = panel.config()
    assert loaded["SD 1.5 \u2014 48 GB+"]["identity"]["student"] == "full"
    assert loaded["SDXL \u2014 24 GB"]["identity"]["model_family"] == "sdxl"
    assert loaded["SDXL \u2014 16 GB"]["resources"]["share_frozen_base"] is True
    assert loaded["SD3-medium \u2014 24 GB"]["resources"]["teacher_cpu_offload"] is False
    flux = loaded["FLUX.1-dev \u2014 48 GB"]
    assert flux["identity"]["model_family"] == "flux" and flux["resources"]["teacher_precision"] == "fp8"
    assert flux["resources"]["share_frozen_base"] is True
    assert loaded["FLUX.1-dev \u2014 80 GB"]["resources"]["teacher_precision"] == "auto"
    assert "80 GB" in panel.file_label.text()


# ------------------------------------------------------------ files

def test_save_writes_a_config_the_engine_loads_and_that_round_trips(qtbot, panel, tmp_path):
    panel.load_file(relative_config(tmp_path))
    line(panel, "resources", "train_batch_size").setText("2")
    assert panel.doc.is_modified() and "modified" in panel.file_label.text()
    path = tmp_path / "configs" / "saved.json"
    assert panel.save_to(path)
    assert panel.doc.path == path and not panel.doc.is_modified() and "modified" not in panel.file_label.text()
    cfg = load_config(path)
    assert cfg.resources.train_batch_size == 2
    assert cfg.identity.train_data_dir == str((tmp_path / "data").resolve())
    other = ConfigPanel(unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(other)
    assert other.load_file(path)
    assert other.config() == panel.config() == json.loads(path.read_text(encoding="utf-8"))
    assert other.json.text() == path.read_text(encoding="utf-8")


def test_save_as_elsewhere_keeps_what_relative_paths_mean(panel, tmp_path):
    assert panel.load_file(DEMO)
    assert panel.doc.path is None  # built-in: Save asks for a new file instead of overwriting it
    target = tmp_path / "elsewhere" / "demo-copy.json"
    target.parent.mkdir()
    assert panel.save_to(target)
    saved, original = load_config(target), load_config(DEMO)
    for group, name in PATH_FIELDS:
        assert getattr(getattr(saved, group), name) == getattr(getattr(original, group), name)


def test_rebase_keeps_paths_below_the_new_folder_relative(tmp_path):
    raw = {"identity": {"train_data_dir": "a/data", "pretrained_model_name_or_path": "/abs/teacher",
                        "output_dir": "../runs"}, "observation": {"resume_from_checkpoint": "latest"}}
    out = rebase_paths(raw, tmp_path, tmp_path / "a")
    assert out["identity"]["train_data_dir"] == "data"
    assert out["identity"]["pretrained_model_name_or_path"] == "/abs/teacher"
    assert out["identity"]["output_dir"] == str((tmp_path.parent / "runs").resolve())
    assert out["observation"]["resume_from_checkpoint"] == "latest"


def test_load_file_failure_keeps_the_panel_and_says_why(panel, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"config_version": 1,,}', encoding="utf-8")
    before = panel.config()
    assert not panel.load_file(bad)
    assert f"{bad}:1:22: invalid JSON" in panel.status.text() and panel.config() == before


# ------------------------------------------------------------ materialize

def test_materialize_of_an_edited_relative_config_gives_resolve_paths_result(panel, tmp_path):
    path = relative_config(tmp_path)
    assert panel.load_file(path)
    assert panel.materialize() == path  # saved and unmodified: the file itself
    line(panel, "resources", "train_batch_size").setText("2")
    out = panel.materialize()
    assert out.parent == tmp_path / "unsaved" and out.name.startswith("rel-")
    written = json.loads(out.read_text(encoding="utf-8"))
    expected = resolve_paths(validate_config(panel.config()), path.parent)
    for group, name in PATH_FIELDS:
        assert get_field(written, (group, name)) == getattr(getattr(expected, group), name)
    assert written["identity"]["output_dir"] == str((tmp_path / "runs").resolve())
    assert written["observation"]["resume_from_checkpoint"] == "latest"
    assert load_config(out) == expected and written["resources"]["train_batch_size"] == 2


def test_materialize_adds_defaulted_paths_and_refuses_invalid_configs(panel, tmp_path):
    base = panel.base_dir()  # the CPU demo preset: relative to resources/configs
    line(panel, "identity", "output_dir").setText("")  # the default "runs" is relative too
    written = json.loads(panel.materialize().read_text(encoding="utf-8"))
    assert written["identity"]["output_dir"] == str((base / "runs").resolve())
    line(panel, "resources", "train_batch_size").setText("0")
    with pytest.raises(ConfigInvalid, match="resources.train_batch_size"):
        panel.materialize()


def test_path_fields_are_the_ones_resolve_paths_resolves():
    cfg = TrainConfig.model_validate({"identity": {
        "pretrained_model_name_or_path": "p", "train_data_dir": "p", "teacher_config_dir": "p", "output_dir": "p",
        "run_name": "p"}, "observation": {"prompt_set": "p", "resume_from_checkpoint": "p"}})
    resolved = resolve_paths(cfg, Path("/base"))
    changed = {(g, n) for g in ("identity", "observation") for n in type(getattr(cfg, g)).model_fields
               if getattr(getattr(cfg, g), n) != getattr(getattr(resolved, g), n)}
    assert changed == set(PATH_FIELDS)


# ------------------------------------------------------------ dry run (the real CLI)

def test_dry_run_shows_resolved_config_and_memory_ledger(qtbot, panel, tmp_path):
    line(panel, "identity", "output_dir").setText(str(tmp_path / "runs"))
    with qtbot.waitSignal(panel._engine.dry_run_finished, timeout=None) as signal:
        assert panel.dry_run()
    assert signal.args[0] == 0, signal.args[1]
    text = panel.dry_run_view.toPlainText()
    assert "Resolved config:" in text and "Memory ledger" in text and "total" in text
    assert str(tmp_path / "runs") in text and panel.side.currentWidget() is panel.dry_run_view
    assert panel.dry_run_button.isEnabled()


def test_dry_run_failure_shows_the_one_line_error(qtbot, panel, tmp_path):
    line(panel, "identity", "train_data_dir").setText(str(tmp_path / "missing"))
    with qtbot.waitSignal(panel._engine.dry_run_finished, timeout=None):
        assert panel.dry_run()
    assert f"dmad: error: train_data_dir not found: {tmp_path / 'missing'}" in panel.dry_run_view.toPlainText()
    assert "Dry run failed" in panel.status.text()


def test_the_data_field_browses_for_a_folder_or_a_dataset_list(panel, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QFileDialog, QToolButton

    editor = panel.form.rows[("identity", "train_data_dir")].editor
    button = next(b for b in editor.findChildren(QToolButton) if b.menu() is not None)
    actions = {a.text(): a for a in button.menu().actions()}
    assert set(actions) == {"Image folder…", "Dataset list (JSON)…"}
    listed = tmp_path / "data.json"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(listed), "JSON (*.json)"))
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path))
    actions["Dataset list (JSON)…"].trigger()
    assert line(panel, "identity", "train_data_dir").text() == str(listed)
    actions["Image folder…"].trigger()
    assert line(panel, "identity", "train_data_dir").text() == str(tmp_path)


def test_teacher_loras_are_a_list_of_files_and_scales_validated_as_you_type(qtbot, panel, monkeypatch, tmp_path):
    from app.widgets.config_form import LoraListEditor

    editor = panel.form.rows[("identity", "teacher_loras")].editor
    assert isinstance(editor, LoraListEditor) and editor.table.rowCount() == 0
    lora = tmp_path / "style.safetensors"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(lora), "LoRA (*.safetensors)"))
    editor.add_button.click()
    assert panel.config()["identity"]["teacher_loras"] == [{"path": str(lora), "scale": 1.0}] and panel.is_valid()
    with qtbot.waitSignal(panel.validity_changed) as signal:
        editor.table.item(0, 1).setText("lots")  # not a number: the engine's words, on the field
    assert signal.args[0] is False and "identity.teacher_loras.0.scale" in signal.args[1]
    assert panel.form.error_of(("identity", "teacher_loras")) == signal.args[1]
    editor.table.item(0, 1).setText("0.75")
    assert panel.config()["identity"]["teacher_loras"] == [{"path": str(lora), "scale": 0.75}] and panel.is_valid()
    type_json(qtbot, panel, json.dumps({**panel.config(), "identity": {
        **panel.config()["identity"], "teacher_loras": [{"path": "a.safetensors", "scale": 1}, {"path": "b.safetensors"}]}}))
    assert [editor.table.item(r, 0).text() for r in range(2)] == ["a.safetensors", "b.safetensors"]  # the JSON shows in the form
    editor.table.selectRow(0)
    editor.remove_button.click()
    assert panel.config()["identity"]["teacher_loras"] == [{"path": "b.safetensors", "scale": 1.0}]


def test_a_relative_lora_path_is_relative_to_the_config_file_like_every_path(tmp_path):
    from app.models.config_doc import materialized, rebase_paths
    from dmad.contract.config import load_config

    (tmp_path / "configs").mkdir()
    raw = {"config_version": 2, "identity": {"pretrained_model_name_or_path": "/t", "train_data_dir": "/d",
                                             "teacher_loras": [{"path": "loras/style.safetensors", "scale": 0.5}]}}
    f = tmp_path / "configs" / "c.json"
    f.write_text(json.dumps(raw))
    assert load_config(f).identity.teacher_loras[0].path == str(tmp_path / "configs" / "loras" / "style.safetensors")
    assert materialized(raw, tmp_path / "configs", "c")["identity"]["teacher_loras"] == [
        {"path": str(tmp_path / "configs" / "loras" / "style.safetensors"), "scale": 0.5}]
    moved = rebase_paths(raw, tmp_path / "configs", tmp_path)  # saved one folder up: still the same file
    assert moved["identity"]["teacher_loras"] == [{"path": "configs/loras/style.safetensors", "scale": 0.5}]
    assert raw["identity"]["teacher_loras"][0]["path"] == "loras/style.safetensors"  # the original is left alone


def test_open_and_save_as_start_in_the_last_folder_used(panel, tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a: asked.append(a[2]) or ("", ""))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a: asked.append(a[2]) or ("", ""))
    panel._on_save_as()  # an untitled preset, nothing used yet: home, never the installation's preset folder
    assert asked[-1] == str(Path.home() / "config.json")
    folder = tmp_path / "configs"
    folder.mkdir()
    assert panel.save_to(folder / "mine.json") and panel.last_folder == folder
    panel.load_preset(presets()[0])  # untitled again
    panel._on_save_as()
    assert asked[-1] == str(folder / "config.json")
    monkeypatch.setattr(panel, "_ask_discard", lambda: True)
    panel._on_open()
    assert asked[-1] == str(folder)


def test_the_users_own_presets_are_saved_listed_opened_and_deleted(qtbot, tmp_path, monkeypatch):
    from app.models.presets import user_presets

    mine = tmp_path / "my-presets"
    panel = ConfigPanel(unsaved_dir=tmp_path / "unsaved", presets_dir=mine)
    qtbot.addWidget(panel)
    panel.apply_changes({"resources.train_batch_size": 3})
    assert not panel.save_preset("CPU demo", "x")  # a shipped name
    assert "is a shipped preset" in panel.status.text()
    assert panel.save_preset("My demo, batch 3", "for the laptop")
    (preset,) = user_presets(mine)[0]
    assert (preset.name, preset.description, preset.method, preset.user) == ("My demo, batch 3", "for the laptop",
                                                                            "dmad", True)
    raw = json.loads(preset.path.read_text())
    assert raw["resources"]["train_batch_size"] == 3
    assert Path(raw["identity"]["train_data_dir"]).is_absolute()  # means the same wherever it is opened
    texts = [a.text() for a in panel.preset_menu.actions()]
    assert "Your presets" in texts and texts.index("Your presets") == len(presets())
    assert any(t.startswith("My demo, batch 3") for t in texts)
    assert panel.save_preset("My demo, batch 3", "replaced") and len(user_presets(mine)[0]) == 1  # same name: replaced
    other = ConfigPanel(unsaved_dir=tmp_path / "unsaved", presets_dir=mine)  # the next launch lists it
    qtbot.addWidget(other)
    assert other.load_preset(user_presets(mine)[0][0]) and other.config()["resources"]["train_batch_size"] == 3
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    assert panel.delete_preset("My demo, batch 3")
    assert user_presets(mine) == ([], "") and list(mine.glob("*.json")) == [mine / "index.json"]
    (mine / "index.json").write_text("{", encoding="utf-8")  # a damaged index: said, the shipped ones still load
    third = ConfigPanel(unsaved_dir=tmp_path / "unsaved", presets_dir=mine)
    qtbot.addWidget(third)
    assert "your presets could not be read" in third.status.text() and len(third.presets) == len(presets())


def test_save_as_preset_dialog_says_what_a_name_does(qtbot):
    from PySide6.QtWidgets import QDialogButtonBox

    from app.dialogs.save_preset import SavePresetDialog
    from app.models.presets import check_preset_name

    dialog = SavePresetDialog(lambda n: check_preset_name(n, presets()), lambda n: n == "mine")
    qtbot.addWidget(dialog)
    save = dialog.buttons.button(QDialogButtonBox.Save)
    assert not save.isEnabled() and dialog.note.text() == "a preset needs a name"
    dialog.name.setText("CPU demo")
    assert not save.isEnabled() and "is a shipped preset" in dialog.note.text()
    dialog.name.setText(" mine ")
    assert save.isEnabled() and dialog.note.text() == "Replaces your preset 'mine'."
    dialog.description.setPlainText("for the laptop ")
    assert dialog.values() == ("mine", "for the laptop")


def test_fields_are_labelled_in_words_with_the_key_in_the_tooltip_and_a_basic_view(qtbot, panel):
    from app.models.field_labels import BASIC, LABELS, _method_words
    from dmad.contract.methods import METHODS

    worded = set(LABELS) | {k for info in METHODS.values() for k in info.settings if _method_words(k)}
    assert set(panel.form.rows) <= worded, sorted(set(panel.form.rows) - worded)  # words for every field
    own = next(k for k in panel.form.rows if k not in LABELS)  # a method's own setting: named by its method
    assert panel.form.rows[own].label.text() == _method_words(own) and ": " in _method_words(own)
    row = panel.form.rows[("identity", "train_data_dir")]
    assert row.label.text() == "Training images *"
    assert row.editor.toolTip().startswith("identity.train_data_dir:")
    assert len(BASIC) <= 15 and set(BASIC) <= set(panel.form.rows)
    assert panel.view_choice.currentData() is True and set(panel.form.shown_fields()) == set(BASIC)
    health = next(box for box, _f, keys in panel.form._groups if keys[0][:2] == ("observation", "health"))
    assert health.isHidden()  # no field of it is basic
    line(panel, "identity", "lora_rank").setText("-3")  # a problem shows in the Basic view too
    assert ("identity", "lora_rank") in panel.form.shown_fields()
    line(panel, "identity", "lora_rank").setText("16")
    assert ("identity", "lora_rank") not in panel.form.shown_fields()
    panel.view_choice.setCurrentIndex(1)  # Advanced: every field
    assert set(panel.form.shown_fields()) == set(panel.form.rows) and not health.isHidden()
