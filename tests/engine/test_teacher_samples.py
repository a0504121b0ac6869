"""Teacher reference samples: rendered by the engine once per run, before iteration 1, with full
provenance in meta.json; a failure is a warning and training goes on."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.contract.config import load_config  # noqa: E402
from dmad.contract.events import is_iteration_metric, read_events  # noqa: E402
from dmad.train.loop import run_training  # noqa: E402


def _train(write_config, run: Path, steps: int, resume=None, extra: dict | None = None) -> int:
    cfg = load_config(write_config({"optimization": {"max_train_steps": steps}, **(extra or {})}))
    return run_training(cfg, run_dir=run, resume=resume, argv=["dmad", "train"])


def test_teacher_samples_are_rendered_once_before_iteration_1_with_provenance(write_config, tmp_path, tiny_teacher):
    run = tmp_path / "run"
    assert _train(write_config, run, 2) == 0
    events = list(read_events(run / "events.jsonl"))
    teacher = [i for i, e in enumerate(events) if e.kind == "samples" and e.data["model"] == "teacher"]
    first_metric = next(i for i, e in enumerate(events) if is_iteration_metric(e))
    assert len(teacher) == 1 and teacher[0] < first_metric
    folder = run / "samples" / "teacher"
    assert sorted(p.name for p in folder.iterdir()) == ["blue.png", "meta.json", "red.png"]
    meta = json.loads((folder / "meta.json").read_text())
    unet = (tiny_teacher / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()
    assert meta["checkpoint"] == "teacher" and meta["weights_sha256"] == hashlib.sha256(unet).hexdigest()
    assert (meta["prompt_set"], meta["prompt_set_version"], meta["steps"], meta["sampler"]) == ("tiny", "v1", 2, "ddim")
    assert meta["items"]["red"]["seed"] == 0 and meta["items"]["blue"]["seed"] == 1
    assert meta["resolution"] == [32, 32] and meta["wall_time_s"] > 0 and meta["deterministic_algorithms"] is False
    assert {"torch", "diffusers", "transformers", "python"} <= set(meta["versions"])

    # resume: the same prompt set and version, so nothing is re-rendered
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert _train(write_config, run, 4, resume=str(run / "checkpoints" / "iter_2")) == 0
    events = list(read_events(run / "events.jsonl"))
    assert sum(1 for e in events if e.kind == "samples" and e.data["model"] == "teacher") == 1  # the first run's
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert events[-1].kind == "finished" and events[-1].iter == 4


def test_teacher_samples_of_another_prompt_set_version_are_rendered_again_on_resume(write_config, tmp_path):
    run = tmp_path / "run"
    assert _train(write_config, run, 1) == 0
    meta_path = run / "samples" / "teacher" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "prompt_set_version": "v0"}))
    assert _train(write_config, run, 2, resume=str(run / "checkpoints" / "iter_1")) == 0
    assert json.loads(meta_path.read_text())["prompt_set_version"] == "v1"


def test_a_teacher_sampling_failure_is_a_warning_and_training_goes_on(write_config, tmp_path, monkeypatch):
    import dmad.sample.render

    def broken(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(dmad.sample.render, "render_teacher_samples", broken)
    run = tmp_path / "run"
    assert _train(write_config, run, 3) == 0
    events = list(read_events(run / "events.jsonl"))
    warnings = [e for e in events if e.kind == "warning"]
    assert len(warnings) == 1 and "teacher samples failed" in warnings[0].data["message"]
    assert "no space left" in warnings[0].data["message"]
    assert events[-1].kind == "finished" and events[-1].iter == 3
    assert not (run / "samples" / "teacher" / "meta.json").exists()
    assert (run / "samples" / "iter_3" / "meta.json").is_file()  # student sampling unaffected


def test_resume_keeps_the_runs_own_prompt_set_when_the_file_was_edited_in_place(write_config, tmp_path,
                                                                                 tiny_prompt_set):
    own = tmp_path / "mine_v1.json"
    own.write_bytes(tiny_prompt_set.read_bytes())
    extra = {"observation": {"prompt_set": str(own), "checkpointing_steps": 1}}
    run = tmp_path / "run"
    assert _train(write_config, run, 1, extra=extra) == 0
    copy = (run / "prompt_set.json").read_bytes()
    edited = json.loads(own.read_text())
    edited["items"][0]["prompt"] = "an edited prompt under the same version"
    own.write_text(json.dumps(edited))
    assert _train(write_config, run, 2, resume=str(run / "checkpoints" / "iter_1"), extra=extra) == 0
    warnings = [e.data["message"] for e in read_events(run / "events.jsonl") if e.kind == "warning"]
    assert any("tiny-v1 was edited in place; using the run's copy" in w for w in warnings), warnings
    assert (run / "prompt_set.json").read_bytes() == copy
    meta = json.loads((run / "samples" / "iter_2" / "meta.json").read_text())
    assert meta["items"]["red"]["prompt"] == "a red square on a black background"


def test_an_unwritable_samples_folder_gives_warnings_and_training_finishes(write_config, tmp_path, monkeypatch):
    """A real filesystem error (samples/ is a regular file), not a mocked render."""
    import shutil

    from dmad.contract.runs import RunFolder

    create = RunFolder.create

    def create_with_a_file_for_samples(path):
        folder = create(path)
        shutil.rmtree(folder.samples_dir)
        folder.samples_dir.write_text("not a folder")
        return folder

    monkeypatch.setattr(RunFolder, "create", staticmethod(create_with_a_file_for_samples))
    run = tmp_path / "run"
    assert _train(write_config, run, 2, extra={"observation": {"checkpointing_steps": 1}}) == 0
    events = list(read_events(run / "events.jsonl"))
    warnings = [e.data["message"] for e in events if e.kind == "warning"]
    assert len(warnings) == 3 and "teacher samples failed" in warnings[0]  # teacher, then iterations 1 and 2
    assert all("NotADirectoryError" in w or "FileExistsError" in w for w in warnings), warnings
    assert events[-1].kind == "finished" and events[-1].iter == 2
    assert (run / "checkpoints" / "iter_2" / "training_state.json").is_file()
