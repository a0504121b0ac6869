"""The procedural shapes dataset: deterministic, truthful captions, and the shipped copy regenerates."""
import json

import numpy as np
import pytest
from PIL import Image

from dmad.demo.shapes import (BACKGROUNDS, COLOURS, MIN_CONTRAST, POSITIONS, SHAPES, SIZES, attributes_for, caption,
                              contrast, render, shape_box, write_dataset)
from dmad.contract.paths import resource
from dmad.contract.prompts import default_prompt_set_path, load_prompt_set

SHIPPED = resource("demo", "shapes")


def files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_seed_same_bytes_different_seed_differs(tmp_path):
    a = files(write_dataset(tmp_path / "a", 12, size=32, seed=5))
    b = files(write_dataset(tmp_path / "b", 12, size=32, seed=5))
    c = files(write_dataset(tmp_path / "c", 12, size=32, seed=6))
    assert a == b
    assert len(a) == 2 * 12 + 1 and not [n for n in a if n.endswith(".tmp")]
    differ = [n for n in a if n.startswith("img_") and a[n] != c[n]]
    assert len(differ) > 12  # most images and captions change with the seed


def test_attributes_are_a_pure_function_of_index_and_seed():
    assert attributes_for(3, 0) == attributes_for(3, 0)
    assert [attributes_for(i, 0) for i in range(20)] != [attributes_for(i, 1) for i in range(20)]
    seen = [attributes_for(i, 0) for i in range(256)]
    for key, values in [("shape", SHAPES), ("colour", COLOURS), ("size", SIZES), ("position", POSITIONS),
                        ("background", BACKGROUNDS)]:
        assert {a[key] for a in seen} == set(values), key  # every value occurs


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_caption_states_every_attribute(seed):
    for i in range(100):
        a = attributes_for(i, seed)
        where = "in the center" if a["position"] == "center" else f"at the {a['position']}"
        assert caption(a) == f"a {a['size']} {a['colour']} {a['shape']} {where} on a {a['background']} background"


def test_shape_colour_never_matches_background():
    for seed in (0, 1, 2):
        for i in range(300):
            a = attributes_for(i, seed)
            assert a["colour"] != a["background"]
            assert contrast(COLOURS[a["colour"]], BACKGROUNDS[a["background"]]) >= MIN_CONTRAST


def test_render_shows_the_attributes():
    for i in range(60):
        a = attributes_for(i, 0)
        img = np.asarray(render(a, 64))
        cx, cy, r = shape_box(a, 64)
        assert tuple(img[int(cy), int(cx)]) == COLOURS[a["colour"]], caption(a)
        colours = {tuple(px) for px in img.reshape(-1, 3)}
        assert colours == {COLOURS[a["colour"]], BACKGROUNDS[a["background"]]}  # flat: nothing else
        fx, fy = POSITIONS[a["position"]]
        if a["position"] != "center":  # the shape stays inside its quadrant: the stated corner is true
            ys, xs = np.nonzero((img != BACKGROUNDS[a["background"]]).any(axis=2))
            assert ((xs < 32) if fx < 0.5 else (xs >= 32)).all() and ((ys < 32) if fy < 0.5 else (ys >= 32)).all()
    assert render(attributes_for(0, 0), 128).size == (128, 128)


def test_rewriting_with_fewer_images_removes_the_rest(tmp_path):
    write_dataset(tmp_path, 10, size=16)
    write_dataset(tmp_path, 4, size=16)
    assert sorted(p.name for p in tmp_path.glob("img_*")) == [f"img_000{i}.{e}" for i in range(4) for e in ("png", "txt")]
    assert json.loads((tmp_path / "dataset.json").read_text())["count"] == 4


def test_shipped_dataset_is_write_dataset_n512_seed0_half_under_specified(tmp_path):
    """PNG bytes depend on the zlib build inside Pillow, so images are compared pixel for pixel;
    captions and dataset.json byte for byte."""
    fresh = write_dataset(tmp_path, 512, size=64, seed=0, under_specified_share=0.5)
    shipped = files(SHIPPED)
    assert sorted(shipped) == sorted(files(fresh))
    for name, data in files(fresh).items():
        if name.endswith(".png"):
            with Image.open(SHIPPED / name) as s, Image.open(fresh / name) as f:
                assert (s.mode, s.size) == (f.mode, f.size) == ("RGB", (64, 64))
                assert np.array_equal(np.asarray(s), np.asarray(f)), name
        else:
            assert shipped[name] == data, name
    meta = json.loads(shipped["dataset.json"])
    assert meta == {"id": "shapes", "type": "local", "instance_data_dir": ".", "caption_strategy": "textfile",
                    "resolution": 64, "count": 512, "seed": 0, "under_specified_share": 0.5,
                    "generator": "dmad.demo.shapes"}


def test_dataset_captions_state_only_what_the_image_shows_and_leave_out_the_share_asked(tmp_path):
    from dmad.demo.metrics import parse_caption

    folder = write_dataset(tmp_path, 400, size=16, seed=3, under_specified_share=0.5)
    under = 0
    for i in range(400):
        a = attributes_for(i, 3)
        stated = parse_caption((folder / f"img_{i:04d}.txt").read_text(encoding="utf-8").strip())
        assert all(a[k] == v for k, v in stated.items()), i  # "a shape" states nothing
        under += len(stated) < 5
    assert 160 <= under <= 240  # 200 expected; binomial SD 10
    full = write_dataset(tmp_path / "full", 50, size=16, seed=3)
    assert all(len(parse_caption(p.read_text(encoding="utf-8").strip())) == 5 for p in full.glob("*.txt"))
    with pytest.raises(ValueError, match="under_specified_share"):
        write_dataset(tmp_path / "bad", 4, under_specified_share=1.5)


def test_demo_prompts_are_captions_the_dataset_can_produce():
    possible = {caption({"shape": s, "colour": c, "size": z, "position": p, "background": b})
                for s in SHAPES for c in COLOURS for z in SIZES for p in POSITIONS for b in BACKGROUNDS
                if c != b and contrast(COLOURS[c], BACKGROUNDS[b]) >= MIN_CONTRAST}
    from dmad.demo.metrics import parse_caption
    from dmad.demo.shapes import conditional

    items = load_prompt_set(default_prompt_set_path()).items
    for item in items:
        if item.topic == "under-specified":  # the generator draws such images (a non-empty conditional)
            stated = parse_caption(item.prompt)
            assert len(stated) < 5 and conditional(stated), item.id
        else:
            assert item.prompt in possible, item.id
    assert sum(item.topic == "under-specified" for item in items) >= 4


def test_vae_mosaics_are_deterministic_and_dense():
    from dmad.demo.shapes import render_mosaic

    a, b = np.asarray(render_mosaic(7, 0)), np.asarray(render_mosaic(7, 0))
    assert a.shape == (64, 64, 3) and (a == b).all()
    assert not (np.asarray(render_mosaic(7, 1)) == a).all()
    colours = [len(np.unique(np.asarray(render_mosaic(i, 0)).reshape(-1, 3), axis=0)) for i in range(20)]
    assert np.mean(colours) >= 3  # several colours per image, unlike the two of a captioned render
