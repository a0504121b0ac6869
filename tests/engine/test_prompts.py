"""Prompt sets: every validation rule answers with one line naming the file and the problem."""
import json
import subprocess
import sys

import pytest

from dmad.errors import UserInputError
from dmad.contract.paths import resource
from dmad.contract.prompts import (PromptSet, default_prompt_set_path, item_seed, load_prompt_set, safe_name_problem,
                          to_json, validate_prompt_set)


def base() -> dict:
    return {"prompt_set": "demo", "version": "v1", "resolution": [64, 64], "seed": 10, "sampler": "ddim",
            "steps": 50, "cfg": 3.0, "items": [
                {"id": "a", "topic": "t", "prompt": "a red circle"},
                {"id": "b", "topic": "t", "prompt": "a blue square", "negative_prompt": "blurry", "seed": 7},
                {"id": "c", "topic": "t", "prompt": "a green cross"}]}


def write(tmp_path, obj, name="set.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=2), encoding="utf-8")
    return p


def load_error(tmp_path, obj) -> str:
    p = write(tmp_path, obj)
    with pytest.raises(UserInputError) as e:
        load_prompt_set(p)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert str(p) in msg, msg
    return msg


def with_item(**fields) -> dict:
    d = base()
    d["items"][0].update(fields)
    return d


def with_set(**fields) -> dict:
    d = base()
    d.update(fields)
    return d


@pytest.mark.parametrize("obj, expected", [
    (with_set(colour="red"), "unknown key 'colour'"),
    (with_set(sampeler="ddim"), "did you mean 'sampler'"),
    (with_item(negative="x"), "unknown key 'items[0].negative' (item id 'a')"),
    ({"prompt_set": "demo", "version": "v1", "resolution": [64, 64], "items": [{"id": "a", "topic": "t"}]},
     "missing required field 'items[0].prompt'"),
    (with_set(items=[{"id": "x", "topic": "t", "prompt": "p"}, {"id": "y", "topic": "t", "prompt": "q"},
                     {"id": "x", "topic": "t", "prompt": "r"}, {"id": "y", "topic": "t", "prompt": "s"}]),
     "duplicate item ids: x, y"),
    (with_item(id="a/b"), "path separator"),
    (with_item(id="a\\b"), "path separator"),
    (with_item(id="..x"), "'..'"),
    (with_item(id="x..y"), "'..'"),
    (with_item(id=""), "must not be empty"),
    (with_item(id=".hidden"), "must not start or end with '.'"),
    (with_item(id="trailing."), "must not start or end with '.'"),
    (with_item(id="CON"), "reserved device name"),
    (with_item(id="con.png"), "reserved device name"),
    (with_item(id="Com1"), "reserved device name"),
    (with_item(id="lpt9.tar.gz"), "reserved device name"),
    (with_item(id="nul"), "reserved device name"),
    (with_item(id="a b"), "may only use letters, digits"),
    (with_item(id="chat:1"), "may only use letters, digits"),
    (with_item(id="café"), "may only use letters, digits"),
    (with_item(id="x" * 101), "longer than 100"),
    (with_set(prompt_set="my set"), "prompt_set: not a safe file name"),
    (with_set(version="../v1"), "version: not a safe file name"),
    (with_set(version="AUX"), "version: not a safe file name"),
    (with_set(resolution=[60, 64]), "multiple of 8"),
    (with_set(resolution=[64, 0]), "multiple of 8"),
    (with_set(resolution=[64]), "resolution"),
    (with_set(resolution=[64, 64, 64]), "resolution"),
    (with_set(items=[]), "at least one item"),
    (with_set(sampler="k_euler"), "sampler"),
    (with_set(steps=0), "steps"),
    (with_set(seed="3"), "seed"),
    (with_set(steps=True), "steps"),
    (with_item(seed=-1), "items[0].seed (item id 'a')"),
    (with_item(prompt=""), "items[0].prompt"),
    ([1, 2], "must be a JSON object"),
    ('{"prompt_set": "demo",\n  "version": "v1"\n  "items": []}', ":3:3: invalid JSON"),
    ('{"prompt_set": "a", "prompt_set": "b"}', "duplicate key 'prompt_set'"),
])
def test_invalid_prompt_set_is_one_line_naming_file_and_problem(tmp_path, obj, expected):
    assert expected in load_error(tmp_path, obj)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(UserInputError, match="not found.*nope.json"):
        load_prompt_set(tmp_path / "nope.json")


@pytest.mark.parametrize("name", ["a", "COM10", "CONSOLE", "con-test", "LPT0", "v1.2", "img_001-b", "A.b.c"])
def test_safe_names_are_accepted(name):
    assert safe_name_problem(name) is None


def test_shipped_prompt_sets_load():
    demo = load_prompt_set(default_prompt_set_path())
    assert default_prompt_set_path() == resource("prompt_sets", "demo_v3.json")
    assert (demo.name, demo.version, demo.resolution, demo.sampler) == ("demo", "v3", [64, 64], "ddim")
    assert len(demo.items) >= 8 and {"single-shape", "colour", "position"} <= {it.topic for it in demo.items}
    # every demo prompt states attributes of the current shapes domain: the evaluator reads them all
    from dmad.demo.metrics import parse_caption
    assert all(parse_caption(it.prompt) for it in demo.items)
    # an earlier version stays as it was, for the runs that name it (prompt sets are immutable)
    v1 = load_prompt_set(resource("prompt_sets", "demo_v1.json"))
    assert v1.version == "v1" and [it.id for it in v1.items] == [it.id for it in demo.items][:len(v1.items)]
    assert {it.topic for it in demo.items[len(v1.items):]} == {"under-specified"}  # what v3 added
    template = load_prompt_set(resource("prompt_sets", "template_v1.json"))
    assert template.resolution == [512, 512] and (template.steps, template.cfg) == (30, 7.5)
    assert len(template.items) >= 8 and any(it.negative_prompt for it in template.items)


def test_item_seed_is_own_seed_or_set_seed_plus_index():
    ps = validate_prompt_set(base())
    assert [item_seed(ps, it) for it in ps.items] == [10, 7, 12]
    assert item_seed(ps, "c") == 12
    with pytest.raises(KeyError):
        item_seed(ps, "zzz")


def test_to_json_round_trips_and_leaves_out_unset_fields(tmp_path):
    ps = load_prompt_set(write(tmp_path, base()))
    raw = to_json(ps)
    assert raw == base()
    assert validate_prompt_set(raw) == ps
    assert isinstance(ps, PromptSet) and ps.width == ps.height == 64


def test_prompts_module_is_torch_free():
    code = "import sys, dmad.contract.prompts; sys.exit(1 if 'torch' in sys.modules or 'PIL' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --------------------------------------------------------------------------- versions

def test_id_with_parent_path_is_refused(tmp_path):
    msg = load_error(tmp_path, with_item(id="../x"))
    assert "items[0].id" in msg and "path separator" in msg


def test_editing_v1_saves_v2_as_a_new_file_and_leaves_v1_untouched(tmp_path):
    from dmad.contract.prompts import save_new_version, save_prompt_set

    lib = tmp_path / "sets"
    v1 = save_prompt_set(base(), lib)
    assert v1 == lib / "demo_v1.json" and load_prompt_set(v1) == validate_prompt_set(base())
    before = v1.read_bytes()

    edited = base()
    edited["items"][0]["prompt"] = "a red circle, edited"
    with pytest.raises(UserInputError) as e:  # re-saving v1 with other content
        save_prompt_set(edited, lib)
    assert "demo-v1 already exists" in str(e.value) and "immutable" in str(e.value) and "\n" not in str(e.value)

    v2 = save_new_version(edited, lib)
    assert v2 == lib / "demo_v2.json" and v1.read_bytes() == before
    got = load_prompt_set(v2)
    assert got.version == "v2" and got.items[0].prompt == "a red circle, edited"
    edited["items"][1]["prompt"] = "a second edit"
    assert save_new_version(edited, lib) == lib / "demo_v3.json"
    assert v1.read_bytes() == before and load_prompt_set(v2) == got

    # saving unchanged content is not a new version
    assert save_prompt_set(base(), lib) == v1 and save_new_version(base(), lib) == v1
    assert sorted(p.name for p in lib.iterdir()) == ["demo_v1.json", "demo_v2.json", "demo_v3.json"]


def test_versions_are_found_by_content_and_an_invalid_edit_is_not_saved(tmp_path):
    from dmad.contract.prompts import find_versions, next_version, save_new_version

    write(tmp_path, base(), name="renamed.json")  # demo v1 under another file name
    write(tmp_path, "{broken", name="junk.json")
    assert set(find_versions(tmp_path, "demo")) == {"v1"}
    edited = base()
    edited["items"][0]["prompt"] = "changed"
    assert save_new_version(edited, tmp_path) == tmp_path / "demo_v2.json"
    bad = base()
    bad["items"][0]["id"] = "../x"
    with pytest.raises(UserInputError, match="path separator"):
        save_new_version(bad, tmp_path)
    assert next_version({"v1", "v9", "beta"}) == "v10" and next_version([]) == "v1" and next_version(["x"]) == "v1"


def test_the_template_covers_the_topics_users_check():
    template = load_prompt_set(resource("prompt_sets", "template_v1.json"))
    assert {"people", "indoor scene", "text and signs", "several objects", "stylised illustration"} <= \
        {it.topic for it in template.items}
