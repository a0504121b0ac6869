"""The Playground: a prompt of the user's on a run's checkpoint and on its teacher, side by side, through
`dmad sample --prompt` (here a small script that writes what the engine writes), with its history of
one-offs (the Playground's pairs and the live run's "Sample prompt…" images). No torch."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from app.models.playground import Request, sample_args, scan_one_offs
from app.panels.playground import PlaygroundPanel
from dmad.contract.runs import RunFolder, atomic_write_json

WAIT_MS = 30_000


def make_run(root: Path, family: str = "sd") -> RunFolder:
    run = RunFolder.create(root / "run")
    atomic_write_json(run.config_json, {"identity": {"model_family": family}})
    atomic_write_json(run.prompt_set_json, {"prompt_set": "demo", "version": "v4", "resolution": [64, 64], "seed": 5,
                                            "items": []})
    for it in (400, 800):
        run.checkpoint_path(it).mkdir(parents=True)
    return run


def write_png(path: Path, colour: str, size=(8, 8)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def test_a_request_is_dmad_sample_arguments():
    req = Request(prompt="a red shape", checkpoint="800", negative_prompt=" ", seed=3, steps=2, cfg=1.5,
                  size=(64, 96), teacher=False)
    assert sample_args(Path("/r"), req) == ["sample", "--run", "/r", "--checkpoint", "800", "--prompt", "a red shape",
                                            "--seed", "3", "--steps", "2", "--cfg", "1.5", "--size", "64x96",
                                            "--no-teacher"]
    assert sample_args(Path("/r"), Request(prompt="p", checkpoint="teacher", teacher=False))[-2:] == ["--prompt", "p"]


def test_history_groups_pairs_and_lists_live_one_offs_newest_first(tmp_path):
    run = make_run(tmp_path)
    folder = run.samples_dir / "oneoff"
    write_png(folder / "iter_400-1.png", "red")  # the live run's Sample prompt…
    atomic_write_json(folder / "iter_400-1.json", {"one_off": True, "checkpoint": None, "iter": 400, "items": {
        "oneoff": {"prompt": "a live one", "seed": 2, "file": "iter_400-1.png"}}})
    for model in ("student", "teacher"):
        write_png(folder / f"iter_800-x-{model}.png", "blue")
        atomic_write_json(folder / f"iter_800-x-{model}.json", {"pair": "iter_800-x", "model": model, "prompt": "p",
                                                                "seed": 7, "file": f"iter_800-x-{model}.png",
                                                                "checkpoint": "iter_800" if model == "student" else None,
                                                                "steps": 4})
    atomic_write_json(folder / "orphan.json", {"pair": "gone", "model": "student", "file": "gone.png"})  # no image
    (folder / "junk.json").write_text("{", encoding="utf-8")
    pairs = scan_one_offs(run.path)
    assert [(p.key, p.prompt, p.seed) for p in pairs] == [("iter_800-x", "p", 7), ("iter_400-1", "a live one", 2)]
    assert pairs[0].student.name == "iter_800-x-student.png" and pairs[0].teacher.name == "iter_800-x-teacher.png"
    assert pairs[1].teacher is None and pairs[0].title() == "p  ·  iter_800, 4 steps, seed 7"


ENGINE = textwrap.dedent(r'''
    import json, sys
    from pathlib import Path
    from PIL import Image
    from dmad.contract.runs import atomic_write_json

    argv = sys.argv[1:]
    Path(sys.argv[0]).with_suffix(".argv").write_text(json.dumps(argv))
    get = lambda flag: argv[argv.index(flag) + 1] if flag in argv else None
    out = Path(get("--run")) / "samples" / "oneoff"
    out.mkdir(parents=True, exist_ok=True)
    if get("--prompt") == "fail":
        print("dmad: error: --size 30x30: each side must be a multiple of 8", file=sys.stderr)
        sys.exit(2)
    w, h = (int(v) for v in get("--size").split("x"))
    pair = f"iter_{get('--checkpoint')}-now"
    models = (("teacher", "blue"),) if get("--checkpoint") == "teacher" else (("student", "red"), ("teacher", "blue"))
    for model, colour in models:
        Image.new("RGB", (w, h), colour).save(out / f"{pair}-{model}.png")
        atomic_write_json(out / f"{pair}-{model}.json", {"pair": pair, "model": model, "prompt": get("--prompt"),
                          "seed": int(get("--seed")), "file": f"{pair}-{model}.png", "steps": 4, "cfg": None,
                          "resolution": [w, h],
                          "checkpoint": f"iter_{get('--checkpoint')}" if model == "student" else None,
                          "sampler": "ddim"})
''')


@pytest.fixture
def panel(qtbot, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE, encoding="utf-8")
    p = PlaygroundPanel(program=[sys.executable, str(script)])
    qtbot.addWidget(p)
    return p


def test_one_click_renders_the_checkpoint_and_the_teacher_side_by_side(qtbot, panel, tmp_path):
    run = make_run(tmp_path)
    panel.set_run(run.path)
    qtbot.waitUntil(lambda: panel.render_button.isEnabled(), timeout=WAIT_MS)
    assert [panel.checkpoint.itemText(i) for i in range(panel.checkpoint.count())] == [
        "iteration 800 (latest)", "iteration 400", "the teacher alone"]
    assert (panel.width_box.value(), panel.height_box.value(), panel.seed.value()) == (64, 64, 5)  # the prompt set's
    run.checkpoint_path(1200).mkdir()  # a new checkpoint (the run went on): the latest is offered first
    panel.refresh()
    qtbot.waitUntil(lambda: panel.checkpoint.count() == 4, timeout=WAIT_MS)
    assert panel.checkpoint.currentText() == "iteration 1,200 (latest)"
    assert panel.history.count() == 1 and panel.history.item(0).text().startswith("No one-off image in this run yet")
    (run.checkpoints_dir / "iter_1200").rmdir()
    panel.refresh()
    qtbot.waitUntil(lambda: panel.checkpoint.count() == 3, timeout=WAIT_MS)
    assert not panel.render()  # no prompt yet: said, nothing started
    assert panel.status.full_text() == "Type a prompt first."
    panel.prompt.setPlainText("a large red circle")
    panel.render_button.click()
    qtbot.waitUntil(lambda: panel.student_box.image.pixmap() is not None and not panel.student_box.image.pixmap().isNull()
                    and not panel.teacher_box.image.pixmap().isNull(), timeout=WAIT_MS)
    argv = json.loads((tmp_path / "engine.argv").read_text())
    assert argv[:8] == ["sample", "--run", str(run.path), "--checkpoint", "800", "--prompt", "a large red circle",
                        "--seed"]
    assert "--no-teacher" not in argv and argv[argv.index("--size") + 1] == "64x64"
    assert panel.student_box.image.pixmap().toImage().pixelColor(10, 10).name() == "#ff0000"
    assert panel.teacher_box.image.pixmap().toImage().pixelColor(10, 10).name() == "#0000ff"
    assert panel.student_box.image.pixmap().width() >= 256  # a 64 px image enlarged
    assert panel.history.count() == 1 and panel.history.item(0).text().startswith("a large red circle")
    assert panel.ab_button.isEnabled()
    seen = []
    panel.ab_requested.connect(lambda *a: seen.append(a))
    panel.ab_button.click()
    assert seen[0][0] == "student" and seen[0][1].name == "iter_800-now-student.png" and seen[0][2] == "teacher"
    panel.prompt.setPlainText("fail")
    assert panel.render()
    qtbot.waitUntil(lambda: panel.render_button.isEnabled(), timeout=WAIT_MS)
    assert panel.status.full_text().startswith("Not rendered:") and "multiple of 8" in panel.status.full_text()


def test_a_family_without_negative_prompt_and_no_run(qtbot, panel, tmp_path):
    assert not panel.render_button.isEnabled() and panel.header.full_text().startswith("No run open")
    run = make_run(tmp_path, family="flux")
    panel.set_run(run.path)
    qtbot.waitUntil(lambda: panel.render_button.isEnabled(), timeout=WAIT_MS)
    assert not panel.negative.isEnabled() and "flux has no negative prompt" in panel.negative.toolTip()
    panel.set_run(None)
    assert not panel.render_button.isEnabled() and panel.history.count() == 0


def test_a_live_run_offers_its_current_weights_rendered_by_its_engine(qtbot, panel, tmp_path):
    run = make_run(tmp_path)
    sent = []
    panel.live_sender = lambda prompt, seed: sent.append((prompt, seed)) or True
    panel.set_run(run.path)
    panel.set_live(True)
    qtbot.waitUntil(lambda: panel.checkpoint.count() == 4, timeout=WAIT_MS)
    assert panel.checkpoint.currentData() == "live" and panel.checkpoint.currentText().startswith("current weights")
    panel.prompt.setPlainText("a small blue circle")
    panel.seed.setValue(9)
    assert panel.render() and sent == [("a small blue circle", 9)]
    # the student by the live engine; the teacher (its own sampler) by dmad sample on the CPU meanwhile
    qtbot.waitUntil(lambda: (tmp_path / "engine.argv").exists() and not panel.command.is_running(), timeout=WAIT_MS)
    argv = json.loads((tmp_path / "engine.argv").read_text())
    assert argv[argv.index("--checkpoint") + 1] == "teacher" and argv[-2:] == ["--device", "cpu"]
    folder = run.samples_dir / "oneoff"  # what the engine writes (validation.render_one_off)
    write_png(folder / "iter_812-1.png", "green", (64, 64))
    atomic_write_json(folder / "iter_812-1.json", {"one_off": True, "iter": 812, "resolution": [64, 64], "items": {
        "oneoff": {"prompt": "a small blue circle", "seed": 9, "file": "iter_812-1.png"}}})
    panel.live_rendered()  # its samples event
    qtbot.waitUntil(lambda: panel.history.count() == 1 and panel.student_box.image.pixmap() is not None
                    and not panel.student_box.image.pixmap().isNull()
                    and not panel.teacher_box.image.pixmap().isNull(), timeout=WAIT_MS)
    assert panel.student_box.image.pixmap().toImage().pixelColor(10, 10).name() == "#008000"
    assert panel.teacher_box.image.pixmap().toImage().pixelColor(10, 10).name() == "#0000ff"  # one pair
    assert panel.ab_button.isEnabled()
    panel.live_sender = lambda prompt, seed: False  # the engine went away meanwhile: said
    assert not panel.render() and "did not take the request" in panel.status.full_text()
