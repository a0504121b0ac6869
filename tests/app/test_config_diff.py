"""Field-level config diff (app.models.config_diff) and its dialog. No torch."""
from __future__ import annotations

import copy

import pytest

from app.models.config_diff import ABSENT, diff_configs, flatten, format_value, same_value
from app.dialogs.config_diff import ConfigDiffDialog

BASE = {
    "config_version": 1,
    "identity": {"pretrained_model_name_or_path": "/models/sd15", "train_data_dir": "/data/cats",
                 "lora_alpha": None},
    "resources": {"train_batch_size": 8, "gradient_accumulation_steps": 1, "gradient_checkpointing": False},
    "optimization": {"generator_lr": 1e-4, "critic_lr": 1e-4, "max_train_steps": 1000},
    "distillation": {"student_steps": 4, "student_timesteps": [999, 749, 499, 249]},
}


def _other() -> dict:
    b = copy.deepcopy(BASE)
    b["optimization"]["generator_lr"] = 2e-5
    b["distillation"]["student_timesteps"] = [999, 499]   # a list differs as a whole
    b["resources"]["gradient_checkpointing"] = True
    del b["identity"]["lora_alpha"]                        # absent in B
    b["observation"] = {"ema_note": "new group"}           # absent in A
    return b


def test_flatten_dotted_paths_and_lists_stay_whole():
    flat = flatten(BASE)
    assert flat["optimization.generator_lr"] == 1e-4
    assert flat["distillation.student_timesteps"] == [999, 749, 499, 249]
    assert flat["config_version"] == 1
    assert "optimization" not in flat
    assert flatten({"a": {}}) == {"a": {}}  # an empty group is still a field


def test_diff_lists_exactly_the_differing_dotted_fields():
    diffs = diff_configs(BASE, _other())
    assert [d.path for d in diffs] == ["identity.lora_alpha", "resources.gradient_checkpointing",
                                       "optimization.generator_lr", "distillation.student_timesteps",
                                       "observation.ema_note"]
    by_path = {d.path: d for d in diffs}
    assert by_path["identity.lora_alpha"].a is None and by_path["identity.lora_alpha"].b is ABSENT
    assert by_path["observation.ema_note"].a is ABSENT
    assert by_path["distillation.student_timesteps"].b == [999, 499]
    assert all(d.differs for d in diffs)


def test_show_all_lists_equal_fields_too():
    everything = diff_configs(BASE, _other(), show_all=True)
    assert len(everything) == len(flatten(BASE)) + 1  # + B's extra field
    equal = [d.path for d in everything if not d.differs]
    assert "optimization.critic_lr" in equal and "config_version" in equal
    assert diff_configs(BASE, copy.deepcopy(BASE)) == []


@pytest.mark.parametrize("a, b, same", [
    (1, 1.0, True), (True, 1, False), (False, 0, False), ("1", 1, False), (None, ABSENT, False),
    ([1, 2], [1, 2], True), ([1, 2], [2, 1], False), ([True], [1], False), (ABSENT, ABSENT, True),
])
def test_same_value_is_json_equality(a, b, same):
    assert same_value(a, b) is same


def test_format_value_tells_types_apart():
    assert format_value(ABSENT) == "(absent)"
    assert format_value(None) == "null"
    assert format_value("1") == '"1"' and format_value(1) == "1"
    assert format_value([999, 499]) == "[999, 499]"


def test_dialog_shows_differing_fields_then_all(qtbot):
    dialog = ConfigDiffDialog("run-a", BASE, "run-b", _other())
    qtbot.addWidget(dialog)
    rows = dialog.rows()
    assert [r[0] for r in rows] == [d.path for d in diff_configs(BASE, _other())]
    assert ("optimization.generator_lr", "0.0001", "2e-05") in rows
    assert ("identity.lora_alpha", "null", "(absent)") in rows
    assert "5 of" in dialog.summary.text()
    dialog.show_all.setChecked(True)
    assert len(dialog.rows()) == len(diff_configs(BASE, _other(), show_all=True))
    assert ("optimization.critic_lr", "0.0001", "0.0001") in dialog.rows()
