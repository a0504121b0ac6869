"""The config's paths checked as you type (app/models/path_check.py): each exists and is the right
kind, with one line naming the field and the path; and the Config panel marks them and disables
Start with the reason, before the engine would refuse the run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.models.path_check import path_problems
from app.models.presets import presets
from app.panels.config import ConfigPanel

TEACHER, DATA = ("identity", "pretrained_model_name_or_path"), ("identity", "train_data_dir")


def pipeline(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "model_index.json").write_text("{}", encoding="utf-8")
    return folder


def config(**identity) -> dict:
    return {"identity": identity}


def test_every_kind_of_path_is_checked(tmp_path):
    good = pipeline(tmp_path / "teacher")
    (tmp_path / "data").mkdir()
    assert path_problems(config(pretrained_model_name_or_path=str(good), train_data_dir="data"), tmp_path) == {}
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "list.json").write_text("[]", encoding="utf-8")
    assert path_problems(config(pretrained_model_name_or_path="model.safetensors", train_data_dir="list.json",
                                teacher_config_dir="teacher"), tmp_path) == {}
    (tmp_path / "bare").mkdir()
    (tmp_path / "old.ckpt").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("", encoding="utf-8")
    cases = [
        (TEACHER, "missing", f"identity.pretrained_model_name_or_path: not found: {tmp_path / 'missing'}"),
        (TEACHER, "bare", f"identity.pretrained_model_name_or_path: {tmp_path / 'bare'} is not a diffusers pipeline "
                          "folder (no model_index.json)"),
        (TEACHER, "old.ckpt", f"identity.pretrained_model_name_or_path: {tmp_path / 'old.ckpt'} is a pickle file (.ckpt): "
                              "convert it to .safetensors (pickles are never loaded)"),
        (TEACHER, "notes.txt", "is neither a pipeline folder nor a .safetensors file"),
        (DATA, "notes.txt", f"identity.train_data_dir: {tmp_path / 'notes.txt'} is neither a folder of captioned images "
                            "nor a dataset list (.json)"),
        (("identity", "teacher_config_dir"), "model.safetensors", "is not a folder"),
    ]
    for key, value, said in cases:
        found = path_problems({key[0]: {key[1]: value}}, tmp_path)
        assert list(found) == [key] and said in found[key], (value, found)


def test_prompt_set_resume_and_loras(tmp_path):
    (tmp_path / "set").mkdir()
    (tmp_path / "lora").mkdir()
    raw = {"observation": {"prompt_set": "set", "resume_from_checkpoint": "nowhere"},
           "identity": {"teacher_loras": [{"path": "lora", "scale": 1.0}]}}
    found = path_problems(raw, tmp_path)
    assert found[("observation", "prompt_set")].endswith("set is a folder, not a .json file")
    assert found[("observation", "resume_from_checkpoint")].endswith(f"not found: {tmp_path / 'nowhere'}")
    assert found[("identity", "teacher_loras")] == (f"identity.teacher_loras[0].path: {tmp_path / 'lora'} is a folder "
                                                    "without pytorch_lora_weights.safetensors")
    (tmp_path / "lora" / "pytorch_lora_weights.safetensors").write_bytes(b"")
    raw["observation"] = {"resume_from_checkpoint": "latest"}  # the engine finds "latest"
    assert path_problems(raw, tmp_path) == {}


def test_placeholders_and_what_is_not_checked(tmp_path):
    found = path_problems(config(pretrained_model_name_or_path="path/to/stable-diffusion-xl-base-1.0",
                                 train_data_dir="", output_dir="nowhere/yet"), tmp_path)
    assert found == {TEACHER: "identity.pretrained_model_name_or_path: 'path/to/stable-diffusion-xl-base-1.0' is a "
                              "placeholder: choose the teacher on this machine"}  # empty: the schema's call
    assert path_problems({"identity": "not a group"}, tmp_path) == {}


def test_shipped_presets_placeholders_only_in_the_gpu_presets():
    for preset in presets():
        raw = json.loads(preset.path.read_text(encoding="utf-8"))
        found = path_problems(raw, preset.path.parent)
        if "path/to/" in json.dumps(raw):
            assert set(found) == {TEACHER, DATA} and all("placeholder" in v for v in found.values()), preset.name
        else:
            assert found == {}, (preset.name, found)


@pytest.fixture
def panel(qtbot, tmp_path) -> ConfigPanel:
    p = ConfigPanel(unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(p)
    qtbot.waitUntil(lambda: p.is_valid(), timeout=10_000)  # the CPU demo's paths are there
    return p


def test_a_gpu_preset_is_red_and_not_startable_until_its_paths_are_chosen(qtbot, panel, tmp_path):
    said = []
    panel.validity_changed.connect(lambda valid, message: said.append((valid, message)))
    sdxl = next(p for p in presets() if p.name.startswith("SDXL"))
    assert panel.load_preset(sdxl)
    qtbot.waitUntil(lambda: not panel.is_valid(), timeout=10_000)
    assert panel.doc.is_valid()  # well formed: only its paths are wrong
    assert said[-1] == (False, "identity.pretrained_model_name_or_path: 'path/to/stable-diffusion-xl-base-1.0' is a "
                               "placeholder: choose the teacher on this machine")
    assert "placeholder" in panel.form.error_of(TEACHER) and "placeholder" in panel.form.error_of(DATA)
    teacher = pipeline(tmp_path / "sdxl")
    panel.form.rows[TEACHER].editor.control().setText(str(teacher))
    qtbot.waitUntil(lambda: panel.form.error_of(TEACHER) == "", timeout=10_000)
    assert not panel.is_valid() and panel.validity_message().startswith("identity.train_data_dir: 'path/to/")
    panel.form.rows[DATA].editor.control().setText(str(tmp_path / "no-data"))
    qtbot.waitUntil(lambda: "not found" in panel.form.error_of(DATA), timeout=10_000)
    (tmp_path / "no-data").mkdir()
    panel.form.rows[DATA].editor.control().setText(str(tmp_path / "no-data") + "/")
    qtbot.waitUntil(panel.is_valid, timeout=10_000)
    assert said[-1] == (True, "")
