"""The demo's style LoRA (issue 40, Personal Lightning): outlined shapes, the style evaluator that
reads them, `dmad demo make-lora`, the shipped LoRA and the "Personal Lightning (demo)" preset."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dmad.demo import shapes  # noqa: E402

TINY = ["--steps", "2", "--batch", "2", "--pool-size", "4", "--warmup-steps", "1", "--check-captions", "2",
        "--check-steps", "2", "--rank", "2"]


def test_an_outline_is_the_shapes_edge_with_the_background_inside():
    for i in range(40):
        a = shapes.attributes_for(i, 0)
        plain = np.asarray(shapes.render(a))
        outline = np.asarray(shapes.render({**a, "style": "outline"}))
        bg = np.array(shapes.BACKGROUNDS[a["background"]])
        in_plain = (plain != bg).any(-1)
        in_outline = (outline != bg).any(-1)
        assert (in_outline <= in_plain).all()                        # nothing drawn outside the shape
        assert 0.2 * in_plain.sum() < in_outline.sum() < 0.9 * in_plain.sum()   # a hollow, not a fill
        cx, cy, _ = shapes.shape_box(a, 64)
        assert not in_outline[int(cy), int(cx)]                      # the centre is background
        assert (outline[in_outline] == shapes.COLOURS[a["colour"]]).all()
    assert (np.asarray(shapes.render({**a, "style": "plain"})) == plain).all()
    with pytest.raises(ValueError, match="unknown style"):
        shapes.render({**a, "style": "striped"})


def test_a_frame_runs_round_the_image_under_a_whole_shape():
    w = round(shapes.FRAME_WIDTH * 64)
    border = np.zeros((64, 64), bool)
    border[:w], border[-w:], border[:, :w], border[:, -w:] = True, True, True, True
    for i in range(40):
        a = shapes.attributes_for(i, 0)
        plain = np.asarray(shapes.render(a))
        framed = np.asarray(shapes.render({**a, "style": "frame"}))
        both = np.asarray(shapes.render({**a, "style": "outline+frame"}))
        bg = np.array(shapes.BACKGROUNDS[a["background"]])
        shape = (plain != bg).any(-1)
        assert (framed[shape] == plain[shape]).all()                       # the shape is whole, on top
        assert (framed[border & ~shape] == shapes.FRAME_COLOUR).all()
        assert (framed[~border] == plain[~border]).all()                   # nothing else changes
        assert (both[~border] == np.asarray(shapes.render({**a, "style": "outline"}))[~border]).all()


@pytest.fixture(scope="module")
def style_evaluator():
    from dmad.demo.evaluator import load_evaluator, style_evaluator_path

    return load_evaluator(style_evaluator_path())


def _fresh(style: str, n: int = 200):
    from dmad.demo.evaluator import REFERENCE_PARITY, indices_of_parity, render_real_attrs, to_unit

    attrs = [{**shapes.attributes_for(i, 4_242_424), "style": style} for i in indices_of_parity(n, 4_242_424, REFERENCE_PARITY)]
    return to_unit(render_real_attrs(attrs)), [shapes.caption(a) for a in attrs]


@pytest.mark.parametrize("style", shapes.STYLES)
def test_the_style_evaluator_reads_style_and_every_attribute_of_fresh_renders(style_evaluator, style):
    from dmad.demo.make_lora import read_style

    images, captions = _fresh(style)
    res = read_style(images, captions, "frame")
    assert res["style"] == (1.0 if "frame" in style else 0.0)
    assert res["styles"].count(style) >= 0.99 * len(captions)
    assert res["adherence"] >= 0.99 and sum(res["right"]) == round(res["adherence"] * len(captions))
    assert list(style_evaluator.vocab)[-1] == "style"


def test_the_plain_evaluator_keeps_its_vocabulary_and_misreads_outlines():
    """Why a second evaluator: the shipped one never saw an outline (and must not: its features are
    the bench's FD)."""
    from dmad.demo.evaluator import load_evaluator
    from dmad.demo.metrics import evaluate_images

    clf = load_evaluator()
    assert "style" not in clf.vocab
    images, captions = _fresh("outline", 100)
    assert evaluate_images(clf, images, captions)["adherence"]["all"] < 0.9


def test_the_shipped_style_lora_is_a_diffusers_lora_the_teacher_takes():
    from dmad.contract.config import TeacherLora
    from dmad.contract.paths import resource
    from dmad.models.teacher import load_teacher

    folder = resource("demo", "style_lora")
    assert {"pytorch_lora_weights.safetensors", "training_config.json", "training_log.jsonl", "README.md"} <= \
        {f.name for f in folder.iterdir()}
    doc = json.loads((folder / "training_config.json").read_text())
    assert doc["style"] == "frame" and doc["check"]["with_lora"]["style"] > doc["check"]["without_lora"]["style"]
    bare = load_teacher(str(resource("demo", "teacher")))
    styled = load_teacher(str(resource("demo", "teacher")), loras=(TeacherLora(path=str(folder), scale=1.0),))
    assert sum(styled.loras[0]["layers"].values()) > 0  # {component: adapted layers}
    changed = [k for k, v in styled.denoiser.state_dict().items() if not torch.equal(v, bare.denoiser.state_dict()[k])]
    assert changed and all("attn" in k or "ff" in k for k in changed)


def test_make_lora_writes_a_lora_diffusers_loads(tmp_path):
    from diffusers import StableDiffusion3Pipeline

    from dmad.contract.paths import resource
    from dmad.demo.make_lora import main

    out = tmp_path / "lora"
    assert main(["--out", str(out), *TINY]) == 0
    assert not list(tmp_path.glob(".lora.*"))  # the temp folder is gone once renamed into place
    doc = json.loads((out / "training_config.json").read_text())
    assert doc["steps"] == 2 and doc["lora_parameters"] > 0 and set(doc["check"]) >= {"with_lora", "without_lora"}
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in log} == {"pool", "lora", "check"}
    pipe = StableDiffusion3Pipeline.from_pretrained(str(resource("demo", "teacher")))
    pipe.load_lora_weights(str(out))
    assert pipe.get_list_adapters() == {"transformer": ["default_0"]}
    assert "orange border" in (out / "README.md").read_text()


def test_make_lora_refuses_bad_input_in_one_line(tmp_path, dmad_cli):
    (tmp_path / "taken").mkdir()
    for args, words in ((["--out", str(tmp_path / "taken")], "already exists"),
                        (["--out", str(tmp_path / "n"), "--style", "striped"], "--style 'striped'"),
                        (["--out", str(tmp_path / "n"), "--steps", "0"], "--steps 0"),
                        (["--out", str(tmp_path / "n"), "--teacher", str(tmp_path)], "no model_index.json")):
        r = dmad_cli("demo", "make-lora", *args)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "n").exists()


def test_make_data_draws_the_shipped_dataset_in_a_style(tmp_path, dmad_cli):
    """`dmad demo make-data --style frame`: the shipped dataset's captions and shapes, every image
    framed (the style LoRA's real images, for a Personal Lightning GAN); refused in one line."""
    import numpy as np
    from PIL import Image

    from dmad.contract.paths import resource
    from dmad.demo.run import main_make_data
    from dmad.demo.shapes import FRAME_COLOUR, STYLES

    out = tmp_path / "framed"
    assert main_make_data(out=out, style="frame") == 0
    shipped = resource("demo", "shapes")
    texts = sorted(p.name for p in shipped.glob("*.txt"))
    assert sorted(p.name for p in out.glob("*.txt")) == texts and len(texts) == 512
    assert all((out / t).read_text() == (shipped / t).read_text() for t in texts)
    for i in (0, 17, 511):
        img, plain = (np.asarray(Image.open(d / f"img_{i:04d}.png").convert("RGB")) for d in (out, shipped))
        assert (img[0] == FRAME_COLOUR).all() and (img[:, -1] == FRAME_COLOUR).all()
        assert (img[8:-8, 8:-8] != plain[8:-8, 8:-8]).any(axis=-1).mean() < 0.05  # the same shape inside
    assert json.loads((out / "dataset.json").read_text())["style"] == "frame"
    assert not list(tmp_path.glob(".framed.*"))
    from dmad.cli import build_parser
    choices = next(a.choices for a in build_parser()._subparsers._group_actions[0].choices["demo"]
                   ._subparsers._group_actions[0].choices["make-data"]._actions if a.dest == "style")
    assert tuple(choices) == STYLES
    for args, words in ((["--out", str(out)], "already exists"),
                        (["--out", str(tmp_path / "n"), "--style", "striped"], "invalid choice: 'striped'"),
                        (["--out", str(tmp_path / "no" / "n")], "does not exist")):
        r = dmad_cli("demo", "make-data", *args)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_personal_lightning_preset_distils_teacher_and_style_lora_into_a_lora_student():
    from pathlib import Path

    from dmad.contract.config import load_config
    from dmad.contract.paths import resource

    from app.models.presets import presets

    cfg = load_config(resource("configs", "demo_personal_lightning.json"))
    assert [Path(x.path) for x in cfg.identity.teacher_loras] == [resource("demo", "style_lora")]
    assert cfg.identity.student == "lora" and cfg.distillation.student_steps == 4
    assert cfg.distillation.generator_gan_weight == 0 and cfg.distillation.critic_gan_weight == 0
    found = {p.name: p for p in presets()}
    assert found["Personal Lightning (demo)"].path == resource("configs", "demo_personal_lightning.json")


def test_bench_intervals_resample_captions_and_pair_rows():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("pl_bench", Path(__file__).parents[2] / "bench" / "personal_lightning.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    groups = [[2 * i, 2 * i + 1] for i in range(50)]
    hits = np.array([1, 1] * 25 + [0, 0] * 25, dtype=float)
    lo, hi = bench.caption_bootstrap(hits, groups)
    assert lo < 0.5 < hi and hi - lo > 0.15          # 50 captions, half of them right: wide
    a, b = {"x": [1] * 100}, {"x": hits.astype(int).tolist()}
    d = bench.paired(a, b, "x", groups)
    assert d["difference"] == pytest.approx(0.5) and d["ci"][0] > 0.3
    assert bench.paired(b, b, "x", groups) == {"difference": 0.0, "ci": [0.0, 0.0]}


def test_the_bench_trains_variants_alone_only_where_nothing_reads_the_presets_run(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("pl_bench", Path(__file__).parents[2] / "bench" / "personal_lightning.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for argv in (["--no-preset", "--no-stacked", "--no-lab"],                      # no variant: nothing to train
                 ["--no-preset", "--no-lab", "--variant", "a=resources.seed=1"],   # the stacked row reads the preset
                 ["--no-preset", "--no-stacked", "--variant", "a=resources.seed=1"]):  # so does the lab
        with pytest.raises(SystemExit) as e:
            bench.main(["--out", str(tmp_path / "b"), *argv])
        assert e.value.code == 2 and "--no-preset needs" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_an_exported_user_lora_is_named_by_its_folder_when_it_is_a_diffusers_folder():
    from dmad.sample.export import lora_name

    assert lora_name("/loras/style_lora/pytorch_lora_weights.safetensors") == "style_lora/pytorch_lora_weights.safetensors"
    assert lora_name("/loras/my_style.safetensors") == "my_style.safetensors"
