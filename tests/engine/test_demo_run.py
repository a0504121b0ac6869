"""`dmad demo` helpers that need no model: the dataset check and its fallback, and the grid."""
from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from dmad.demo import run as demo_run
from dmad.demo.shapes import write_dataset
from dmad.contract.paths import resource


def test_the_shipped_dataset_is_complete():
    assert demo_run.dataset_complete(resource("demo", "shapes"))


def test_a_dataset_of_other_captions_is_not_the_demos(tmp_path):
    """The demo's data holds under-specified captions; the same images with full captions only
    (the dataset before 2026-12-06) are regenerated, not distilled on."""
    folder = write_dataset(tmp_path / "shapes", demo_run.DATASET_SIZE, 64, demo_run.DATASET_SEED)
    assert not demo_run.dataset_complete(folder)
    assert demo_run.ensure_dataset(folder) is None and demo_run.dataset_complete(folder)


def test_an_incomplete_dataset_is_regenerated_in_place(tmp_path):
    folder = write_dataset(tmp_path / "shapes", demo_run.DATASET_SIZE, 64, demo_run.DATASET_SEED,
                           demo_run.DATASET_UNDER_SPECIFIED)
    assert demo_run.dataset_complete(folder)
    (folder / "img_0007.png").unlink()
    assert not demo_run.dataset_complete(folder)
    assert demo_run.ensure_dataset(folder) is None
    assert demo_run.dataset_complete(folder)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_dataset_folder_falls_back_to_the_user_cache(tmp_path, monkeypatch):
    shipped = tmp_path / "ro"
    shipped.mkdir()
    shipped.chmod(0o555)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        got = demo_run.ensure_dataset(shipped)
    finally:
        shipped.chmod(0o755)
    assert got == tmp_path / "cache" / "dmad-studio" / "shapes" and demo_run.dataset_complete(got)


def test_an_unwritable_dataset_folder_falls_back_to_the_user_cache_even_as_root(tmp_path, monkeypatch):
    """The same fallback when writing fails for any reason (root ignores permission bits)."""
    from dmad.demo import shapes

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    original, tried = shapes.write_dataset, []

    def write_or_refuse(out, n, size, seed, share):
        tried.append(out)
        if out == tmp_path / "ro":
            raise PermissionError(f"{out}: read-only file system")
        return original(out, n, size, seed, share)

    monkeypatch.setattr(shapes, "write_dataset", write_or_refuse)
    got = demo_run.ensure_dataset(tmp_path / "ro")
    assert tried[0] == tmp_path / "ro"
    assert got == tmp_path / "cache" / "dmad-studio" / "shapes" and demo_run.dataset_complete(got)


def test_grid_has_a_row_per_prompt_and_teacher_first_then_iterations_in_order(tmp_path):
    samples = tmp_path / "samples"
    for col, colour in (("iter_100", "red"), ("teacher", "blue"), ("iter_20", "green")):
        (samples / col).mkdir(parents=True)
        for i in ("a", "b"):
            Image.new("RGB", (8, 8), colour).save(samples / col / f"{i}.png")
    (samples / "iter_100" / "b.png").unlink()  # a cell without its image: grey, the grid still whole
    out = demo_run.write_grid(samples, ["a", "b"], ["a red shape", "a blue circle"], title="run-1")
    meta = json.loads((samples / "grid.json").read_text())
    assert (meta["rows"], meta["columns"]) == (["a", "b"], ["teacher", "iter_20", "iter_100"])
    assert meta["row_labels"] == ["a: a red shape", "b: a blue circle"]
    assert meta["column_labels"] == ["teacher", "iteration 20", "iteration 100"]
    colours = {("teacher", "a"): (0, 0, 255), ("iter_20", "b"): (0, 128, 0), ("iter_100", "a"): (255, 0, 0),
               ("iter_100", "b"): (40, 40, 40)}
    with Image.open(out) as im:
        for cell in meta["cells"]:
            x, y, w, h = cell["box"]
            assert w == h == 128  # 8 px images drawn 16x: readable, exact pixels
            assert cell["image"] == f"{cell['column']}/{cell['row']}.png"
            want = colours.get((cell["column"], cell["row"]))
            if want is not None:
                assert im.getpixel((x + w // 2, y + h // 2)) == want, cell
        left = min(c["box"][0] for c in meta["cells"])
        label_strip = im.crop((0, meta["cells"][0]["box"][1], left, im.size[1])).convert("L")
        assert label_strip.getextrema()[0] < 100  # the row labels are drawn (dark text on the light sheet)
        header = im.crop((left, 0, im.size[0], meta["cells"][0]["box"][1])).convert("L")
        assert header.getextrema()[0] < 100


def test_the_demo_says_each_validations_health(capsys):
    """`dmad demo` prints a health event's figures (its alerts follow as warning lines)."""
    import json

    from dmad.demo.run import _progress

    line = json.dumps({"v": 1, "t": 1.0, "kind": "health", "iter": 400,
                       "data": {"signals": {"diversity": 0.842, "saturation": 0.938, "detail": 1.09}, "alerts": []}})
    _progress(line, {})
    alert = json.dumps({"v": 1, "t": 1.0, "kind": "health", "iter": 300,
                        "data": {"signals": {"diversity": 0.56}, "alerts": [{"signal": "diversity"}]}})
    _progress(alert, {})
    out = capsys.readouterr().out.splitlines()
    assert out == ["  health at iter 400: diversity 84%, saturation 94%, detail 109% of the teacher's (no alert)",
                   "  health at iter 300: diversity 56% of the teacher's (alert: diversity)"]
