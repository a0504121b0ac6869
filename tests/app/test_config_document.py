"""The Config panel's Document (app/models/document.py) without Qt: edits from the form, the JSON view
and code, each judged with the engine's own messages and announced so the views that did not make the
edit redraw; modified against what the file holds; a run's config shown read-only while the document
being edited waits aside. The panel's widgets bound to it are tested in test_config_panel.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.models.config_doc import UNSET, form_spec, get_field
from app.models.document import APPLY, DOCUMENT, FORM, JSON, Document
from dmad.contract.config import validate_config
from dmad.contract.jsonfile import read_json_file
from dmad.contract.paths import resource
from dmad.errors import UserInputError

DEMO = resource("configs", "demo.json")
BATCH = ("resources", "train_batch_size")


def engine_message(raw: dict, source: str = "config") -> str:
    with pytest.raises(UserInputError) as e:
        validate_config(raw, source)
    return str(e.value)


class Seen:
    """What a Document emitted, in order."""

    def __init__(self, doc: Document):
        self.items: list = []
        doc.changed.connect(lambda origin: self.items.append(("changed", origin)))
        doc.json_failed.connect(lambda message: self.items.append(("json failed", message)))
        doc.validity_changed.connect(lambda valid, message: self.items.append(("valid", valid, message)))
        doc.modified_changed.connect(lambda modified: self.items.append(("modified", modified)))

    def take(self) -> list:
        items, self.items = self.items, []
        return items


@pytest.fixture(scope="module")
def spec():
    return form_spec()


@pytest.fixture
def doc(spec) -> Document:
    d = Document(spec, Path.cwd())
    d.replace(read_json_file(DEMO, "config"), DEMO.parent, None, "preset CPU demo")
    return d


def test_a_new_document_is_judged_and_says_so_once(spec):
    doc = Document(spec, Path("/base"))
    seen = Seen(doc)
    doc.replace(read_json_file(DEMO, "config"), DEMO.parent, None, "preset CPU demo")
    assert seen.take() == [("changed", DOCUMENT), ("valid", True, "")]  # unmodified: nothing to say about it
    assert doc.is_valid() and not doc.is_modified() and not doc.is_read_only()
    assert (doc.name(), doc.label(), doc.source()) == ("untitled (preset CPU demo)", "untitled (preset CPU demo)",
                                                       "config")
    assert doc.json_text().startswith('{\n  "config_version"')


def test_a_form_edit_is_judged_with_the_engines_message(doc):
    seen = Seen(doc)
    doc.set_field(BATCH, 0)
    message = engine_message(doc.config())
    assert "resources.train_batch_size" in message
    assert seen.take() == [("changed", FORM), ("valid", False, message), ("modified", True)]
    assert doc.problems.fields[BATCH] == message and doc.validity_message() == message
    doc.set_field(BATCH, UNSET)  # cleared: the engine's default applies
    assert get_field(doc.raw, BATCH) is UNSET and doc.is_valid()
    assert seen.take() == [("changed", FORM), ("valid", True, "")]  # still modified: the file has the key


def test_the_json_view_edits_the_same_dict_or_says_why_it_cannot(doc):
    seen = Seen(doc)
    before = doc.config()
    doc.fail_json("line 3, column 3: Expecting ',' delimiter")
    assert seen.take() == [("json failed", "line 3, column 3: Expecting ',' delimiter"),
                           ("valid", False, "JSON: line 3, column 3: Expecting ',' delimiter")]
    assert doc.config() == before and not doc.is_valid()
    doc.set_json([1, 2])  # parses, but the form cannot show it
    assert seen.take() == [("json failed", "the config must be a JSON object, got list"),
                           ("valid", False, "JSON: the config must be a JSON object, got list")]
    raw = doc.config()
    raw["resources"]["train_batch_size"] = 3
    doc.set_json(raw)
    assert seen.take() == [("changed", JSON), ("valid", True, ""), ("modified", True)]
    assert doc.raw["resources"]["train_batch_size"] == 3 and doc.json_error == ""
    doc.fail_json("line 1, column 1: Expecting value")
    doc.set_field(BATCH, 2)  # the form's state replaces whatever the JSON view held
    assert doc.is_valid() and doc.raw["resources"]["train_batch_size"] == 2


def test_apply_sets_dotted_fields_as_one_edit(doc):
    seen = Seen(doc)
    doc.apply({"resources.train_batch_size": 1, "resources.gradient_checkpointing": True})
    assert seen.take() == [("changed", APPLY), ("modified", True)]
    assert doc.raw["resources"]["train_batch_size"] == 1 and doc.raw["resources"]["gradient_checkpointing"] is True


def test_a_runs_config_is_shown_read_only_while_the_document_waits_aside(doc, tmp_path):
    doc.set_field(BATCH, 2)
    edited = doc.config()
    run_raw = {**doc.config(), "identity": {**doc.raw["identity"], "run_name": "r1"}}
    seen = Seen(doc)
    doc.show_run(tmp_path / "r1", run_raw)
    assert seen.take() == [("changed", DOCUMENT), ("modified", False)]
    assert doc.is_read_only() and doc.run_view == tmp_path / "r1" and doc.base_dir == tmp_path / "r1"
    assert doc.label() == f"{tmp_path / 'r1' / 'config.json'} (read-only)"
    assert doc.name() == "untitled (preset CPU demo)" and doc.has_unsaved_changes()  # the waiting one's edits
    doc.show_run(tmp_path / "r2", run_raw)  # a second run replaces the first; the document still waits
    assert doc.back() and not doc.is_read_only()
    assert (doc.config(), doc.base_dir, doc.origin, doc.is_modified()) == (edited, DEMO.parent, "preset CPU demo",
                                                                           True)
    assert not doc.back()  # nothing waits any more


def test_a_new_run_from_the_shown_config_is_untitled_without_the_run_name(doc, tmp_path):
    run_raw = {**doc.config(), "identity": {**doc.raw["identity"], "run_name": "r1"}}
    doc.show_run(tmp_path / "r1", run_raw)
    assert doc.new_run_from_view() == "r1"
    assert not doc.is_read_only() and doc.raw["identity"]["run_name"] is None
    assert (doc.name(), doc.base_dir, doc.is_modified()) == ("untitled (from run r1)", tmp_path / "r1", False)
    assert not doc.back()  # the document that waited was dropped
    with pytest.raises(RuntimeError, match="no run"):
        doc.new_run_from_view()


def test_a_saved_document_names_its_file(doc, tmp_path):
    path = tmp_path / "mine.json"
    doc.set_field(BATCH, 0)
    doc.replace(doc.raw, tmp_path, path, "")  # what save_to does once the file is written
    assert (doc.name(), doc.label(), doc.source(), doc.is_modified()) == (str(path), str(path), "mine.json", False)
    assert doc.validity_message() == engine_message(doc.config(), "mine.json")  # the engine names the file
