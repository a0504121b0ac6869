"""Issue 39: the engine adds an optional group inside a group, observation.health {alerts, stop_on_alert}
(dmad/contract/config.py, the engine's branch). The generated form shows it as a group of its own with
no special code, and its edits land at observation.health.<field>. (Before: form_spec read
prop["type"] of the nested $ref and raised KeyError: the Config tab would not open.)"""
from __future__ import annotations

import copy

from pydantic import Field

from app.models.config_doc import _field_of, all_fields, form_spec, json_schema, with_field
from app.widgets.config_form import BoolEditor, ConfigForm
from dmad.contract.config import Group, Observation


class Health(Group):
    """Health signals of the samples against the teacher's (issue 39)."""

    alerts: bool = Field(True, description="Raise alerts (a warning, a banner, a notification).")
    stop_on_alert: bool = Field(False, description="Stop the run at an alert, keeping the last healthy checkpoint.")


class ObservationWithHealth(Observation):
    health: Health = Field(default_factory=Health, description="Health signals and their alerts.")


def _schema() -> dict:
    """The engine's schema with observation.health, as pydantic writes it in the engine's branch."""
    schema = copy.deepcopy(json_schema())
    nested = ObservationWithHealth.model_json_schema()
    schema["$defs"]["Health"] = nested["$defs"]["Health"]
    ref = schema["properties"]["observation"]["$ref"].rsplit("/", 1)[-1]
    schema["$defs"][ref]["properties"]["health"] = nested["properties"]["health"]
    return schema


def test_a_nested_group_is_a_group_of_its_own(qtbot):
    spec = form_spec(_schema())
    names = [g.name for g in spec]
    assert names[names.index("observation") + 1] == "observation.health"
    group = spec[names.index("observation.health")]
    assert [(f.key, f.kind, f.default) for f in group.fields] == [
        (("observation", "health", "alerts"), "bool", True), (("observation", "health", "stop_on_alert"), "bool", False)]
    assert group.description.startswith("Health signals of the samples")
    assert ("observation", "health") not in all_fields(spec)  # the group is not a field

    form = ConfigForm(spec)
    qtbot.addWidget(form)
    row = form.rows[("observation", "health", "stop_on_alert")]
    assert isinstance(row.editor, BoolEditor)
    form.set_values({"observation": {"health": {"stop_on_alert": True}}})
    assert row.editor.value() is True and form.rows[("observation", "health", "alerts")].editor.value() is True
    edits = []
    form.field_edited.connect(lambda key, value: edits.append((key, value)))
    row.editor.box.setChecked(False)
    assert edits == [(("observation", "health", "stop_on_alert"), False)]
    assert with_field({}, *edits[0]) == {"observation": {"health": {"stop_on_alert": False}}}
    known = all_fields(spec)
    assert _field_of(("observation", "health", "alerts"), known) == ("observation", "health", "alerts")
