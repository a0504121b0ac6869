"""Bad training data never stops a run: the real CLI on a tiny pipeline with a corrupt image and
an empty caption, a folder with too few usable images, and a resume across a skipped item."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests.conftest import dmad_in_process

torch = pytest.importorskip("torch")

from dmad.contract.events import read_events  # noqa: E402


def _noise_png(path: Path, size: int = 32, seed: int = 0) -> None:
    from PIL import Image

    rng = random.Random(seed)
    Image.frombytes("RGB", (size, size), bytes(rng.randrange(256) for _ in range(size * size * 3))).save(path)


def _truncated_png(path: Path) -> None:
    """A PNG whose header is fine (the scan passes it) but whose pixel data stops half way:
    only decoding finds it, so training meets it on load."""
    _noise_png(path, seed=99)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _bad_folder(tmp_path: Path, tiny_data: Path, good: int) -> Path:
    folder = tmp_path / "bad_data"
    folder.mkdir()
    for img in sorted(tiny_data.glob("*.png"))[:good]:
        shutil.copy(img, folder / img.name)
        shutil.copy(img.with_suffix(".txt"), folder / img.with_suffix(".txt").name)
    _truncated_png(folder / "broken.png")
    (folder / "broken.txt").write_text("a broken image", encoding="utf-8")
    _noise_png(folder / "silent.png", seed=1)
    (folder / "silent.txt").write_text("  \n", encoding="utf-8")
    return folder


def _config(write_config, folder: Path, steps: int, name: str = "config.json", every: int = 0) -> Path:
    return write_config({"identity": {"train_data_dir": str(folder)},
                         "resources": {"train_batch_size": 2},
                         "optimization": {"max_train_steps": steps, "lr_scheduler": "constant"},
                         "observation": {"checkpointing_steps": every or steps}}, name=name)


def _skip_events(run: Path) -> list:
    return [e for e in read_events(run / "events.jsonl") if e.kind == "warning" and e.data.get("category")]


def test_a_corrupt_image_and_an_empty_caption_are_skipped_and_reported(write_config, tmp_path, tiny_data):
    folder = _bad_folder(tmp_path, tiny_data, good=4)
    run = tmp_path / "run"
    # 5 items pass the scan; 4 iterations x 2 samples walk all of them, the broken one included
    assert dmad_in_process("train", "--config", str(_config(write_config, folder, 4)), "--run-dir", str(run)) == 0
    skips = {(e.data["category"], Path(e.data["path"]).name, e.data["stage"]) for e in _skip_events(run)}
    assert skips == {("empty_caption", "silent.txt", "scan"), ("image_corrupt", "broken.png", "load")}
    assert all(e.data["message"] and e.data["detail"] for e in _skip_events(run))
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished"
    assert status["skipped_items"] == {"total": 2, "by_category": {"empty_caption": 1, "image_corrupt": 1}}
    assert "broken.png" in (run / "logs" / "engine.log").read_text()


def test_too_few_usable_images_stop_before_anything_loads(write_config, dmad_cli, tmp_path, tiny_data):
    folder = _bad_folder(tmp_path, tiny_data, good=2)
    (folder / "mute.png").write_bytes(b"not an image at all")
    (folder / "mute.txt").write_text("a mute image", encoding="utf-8")
    (folder / "orphan.png").write_bytes((folder / "silent.png").read_bytes())
    # the teacher does not exist: had the data check not stopped the run, the error would name it
    cfg = write_config({"identity": {"train_data_dir": str(folder), "pretrained_model_name_or_path":
                                     str(tmp_path / "no_teacher")},
                        "resources": {"train_batch_size": 4, "gradient_accumulation_steps": 2}})
    run = tmp_path / "run"
    r = dmad_cli("train", "--config", str(cfg), "--run-dir", str(run), timeout=120)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"dmad: error: train_data_dir {folder}: 3 usable images, fewer than one effective batch of 8 "
        f"(3 unusable: 1 empty_caption, 1 image_corrupt, 1 image_without_caption; "
        f"run `dmad check-data {folder} --min-size 8` for the paths)"]
    assert r.stdout == "" and not run.exists()


@pytest.mark.slow
def test_resume_across_a_skipped_item_gives_the_same_weights(write_config, tmp_path, tiny_data):
    """In process (the CLI's main(); its process boundary is tested in test_train.py)."""
    from safetensors.torch import load_file

    folder = _bad_folder(tmp_path, tiny_data, good=4)
    cfg = _config(write_config, folder, 6, every=3)
    straight = tmp_path / "straight"
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(straight)) == 0

    # the same run stopped at iteration 3 (a checkpoint; the broken image was met in iteration 2
    # or 3 of the first epoch of 5 items), then resumed to 6
    first = _config(write_config, folder, 3, name="first.json", every=3)
    split = tmp_path / "split"
    assert dmad_in_process("train", "--config", str(first), "--run-dir", str(split)) == 0
    assert [Path(e.data["path"]).name for e in _skip_events(split) if e.data["stage"] == "load"] == ["broken.png"]
    shutil.copy(cfg, first)  # same run, now to 6 iterations
    assert dmad_in_process("train", "--config", str(first), "--run-dir", str(split), "--resume", "latest") == 0

    for f in ("student/diffusion_pytorch_model.safetensors", "fake_score/diffusion_pytorch_model.safetensors",
              "gan_head.safetensors"):
        ta, tb = load_file(str(straight / "checkpoints/iter_6" / f)), load_file(str(split / "checkpoints/iter_6" / f))
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), f"{f} differs after resume"
    # each bad item reported once in each run, and the same counts
    key = [(e.data["category"], Path(e.data["path"]).name) for e in _skip_events(straight)]
    assert sorted(key) == sorted((e.data["category"], Path(e.data["path"]).name) for e in _skip_events(split))
    status = [json.loads((run / "status.json").read_text()) for run in (straight, split)]
    assert status[0]["skipped_items"] == status[1]["skipped_items"] == {
        "total": 2, "by_category": {"empty_caption": 1, "image_corrupt": 1}}
