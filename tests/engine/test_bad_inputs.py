"""Every invalid input: exit 2, one line on stderr naming the problem and where, no traceback.

Each case runs the real CLI (`python -m dmad train ...`) in a subprocess, as a user's script
would. Config errors never import torch, so most cases take ~0.3 s.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


def _bad_json(t) -> list[str]:
    (t.tmp / "bad.json").write_text('{\n  "identity": {,\n}\n', encoding="utf-8")
    return ["--config", "bad.json"]


def _text(name: str, text: str):
    def setup(t) -> list[str]:
        (t.tmp / name).write_text(text, encoding="utf-8")
        return ["--config", name]
    return setup


def _cfg(extra: dict, *more: str):
    """A valid tiny config with `extra` merged over it, plus more CLI arguments."""
    return lambda t: ["--config", str(t.write(extra)), *more]


def _teacher(make):
    """A tiny config whose teacher is what make(tmp_path, tiny_teacher) returns."""
    return lambda t: ["--config", str(t.write({"identity": {"pretrained_model_name_or_path": str(make(t.tmp, t.teacher))}}))]


def _data(make):
    return lambda t: ["--config", str(t.write({"identity": {"train_data_dir": str(make(t.tmp))}}))]


def _not_a_pipeline(tmp: Path, _) -> Path:
    folder = tmp / "not_a_pipeline"
    folder.mkdir()
    (folder / "readme.txt").write_text("just some files\n")
    return folder


def _kandinsky(tmp: Path, _) -> Path:
    folder = tmp / "kandinsky_teacher"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "KandinskyPipeline"}))
    return folder


def _sdxl(tmp: Path, _) -> Path:
    folder = tmp / "sdxl_teacher"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusionXLPipeline", "_diffusers_version": "0.42.1",
        "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
        "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
        "scheduler": ["diffusers", "EulerDiscreteScheduler"]}))
    return folder


def _weightless(tmp: Path, teacher: Path) -> Path:
    """The tiny teacher's configs and tokenizer without its .safetensors: enough for a dry run."""
    folder = tmp / "configs_only"
    shutil.copytree(teacher, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    return folder


def _pickle_ckpt(tmp: Path, _) -> Path:
    path = tmp / "model.ckpt"
    path.write_bytes(b"\x80\x02}q\x00.")  # a pickle: running it could execute anything
    return path


def _empty_dir(name: str):
    def make(tmp: Path) -> Path:
        (tmp / name).mkdir()
        return tmp / name
    return make


def _existing_run(*cli: str):
    def setup(t) -> list[str]:
        run = t.tmp / "runs" / "tiny"
        (run / "checkpoints").mkdir(parents=True)
        (run / "config.json").write_text("{}\n")
        return ["--config", str(t.write()), *cli]
    return setup


# (id, setup(t) -> train arguments, words the one stderr line must contain)
CASES = [
    ("json_syntax", _bad_json, ["bad.json:2:16", "invalid JSON"]),
    ("not_an_object", _text("list.json", "[1, 2, 3]\n"), ["list.json", "must be a JSON object", "list"]),
    ("missing_file", lambda t: ["--config", "nope.json"], ["config file not found", "nope.json"]),
    ("duplicate_key", _text("dup.json", '{"config_version": 1, "config_version": 1}'), ["dup.json", "duplicate key 'config_version'"]),
    ("missing_required", _text("min.json", '{"identity": {"pretrained_model_name_or_path": "t"}}'),
     ["min.json", "missing required field 'identity.train_data_dir'"]),
    ("unknown_top_key", _cfg({"optimisation": {}}), ["config.json", "unknown key 'optimisation'", "did you mean 'optimization'"]),
    ("nested_typo", _cfg({"resources": {"train_batch_szie": 2}}),
     ["unknown key 'resources.train_batch_szie'", "did you mean 'train_batch_size'"]),
    ("string_for_number", _cfg({"optimization": {"generator_lr": "fast"}}), ["optimization.generator_lr", "valid number", '"fast"']),
    ("negative_batch", _cfg({"resources": {"train_batch_size": -1}}), ["resources.train_batch_size", "greater than or equal to 1", "-1"]),
    ("resolution_not_8", _cfg({"resources": {"resolution": 36}}), ["resources.resolution", "multiple of 8", "36"]),
    ("student_steps_0", _cfg({"distillation": {"student_steps": 0}}), ["distillation.student_steps", "greater than or equal to 1"]),
    ("student_steps_5", _cfg({"distillation": {"student_steps": 5}}), ["distillation.student_steps", "less than or equal to 4"]),
    ("min_ge_max_timestep", _cfg({"distillation": {"min_timestep": 500, "max_timestep": 500}}),
     ["distillation", "min_timestep (500)", "max_timestep (500)"]),
    ("timesteps_length", _cfg({"distillation": {"student_steps": 2, "student_timesteps": [999, 666, 333]}}),
     ["student_timesteps has 3 entries", "student_steps is 2"]),
    ("config_version_future", _cfg({"config_version": 99}), ["config_version 99", "not supported"]),
    ("teacher_missing", _teacher(lambda tmp, _: tmp / "no_such_teacher"), ["no_such_teacher", "not found"]),
    ("teacher_not_pipeline", _teacher(_not_a_pipeline), ["not_a_pipeline", "model_index.json"]),
    ("teacher_sdxl_incomplete", _teacher(_sdxl), ["sdxl_teacher", "component folder 'unet/' is missing"]),
    ("teacher_unknown_family", _teacher(_kandinsky), ["kandinsky_teacher", "unsupported model family (KandinskyPipeline)"]),
    ("teacher_pickle", _teacher(_pickle_ckpt), ["model.ckpt", "safetensors"]),
    ("teacher_without_weights", _teacher(_weightless), ["teacher has no weights", "configs_only", "unet"]),
    ("data_empty", _data(_empty_dir("empty_data")), ["train_data_dir", "empty_data", "no images"]),
    ("data_missing", _data(lambda tmp: tmp / "no_such_data"), ["train_data_dir not found", "no_such_data"]),
    ("run_folder_exists", _existing_run(), ["run folder already exists", "runs/tiny", "--resume latest"]),
    ("resume_bad_path", _existing_run("--resume", "runs/tiny/checkpoints/iter_7"),
     ["--resume", "iter_7", "not a complete checkpoint"]),
    ("set_without_equals", _cfg({}, "--set", "resources.resolution"), ["--set", "resources.resolution", "key=value"]),
    ("set_unknown_key", _cfg({}, "--set", "resources.train_batch_sise=2"),
     ["--set resources.train_batch_sise=2", "unknown key", "did you mean 'train_batch_size'"]),
    ("set_wrong_type", _cfg({}, "--set", "resources.train_batch_size=two"),
     ["--set resources.train_batch_size=two", "valid integer"]),
    ("set_into_a_value", _cfg({}, "--set", "resources.resolution.x=1"), ["--set", "'resolution' is not a group"]),
    ("unknown_flag", _cfg({}, "--frobnicate"), ["unrecognized arguments", "--frobnicate"]),
    ("missing_config_flag", lambda t: [], ["required", "--config"]),
]


class _Setup:
    def __init__(self, tmp: Path, write, teacher: Path):
        self.tmp, self.write, self.teacher = tmp, write, teacher


@pytest.mark.parametrize("setup,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(setup, words, tmp_path, write_config, tiny_teacher, dmad_cli):
    proc = dmad_cli("train", *setup(_Setup(tmp_path, write_config, tiny_teacher)))
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].strip(), proc.stderr
    assert lines[0].startswith("dmad: error: "), lines[0]
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    assert proc.stdout == ""  # stdout is the event stream: an error never writes to it


def test_config_errors_are_found_before_torch_is_imported(write_config, run_python):
    cfg = write_config({"resources": {"resolution": 36}})
    proc = run_python(
        "import sys\nfrom dmad.cli import main\n"
        f"rc = main(['train', '--config', {str(cfg)!r}])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(rc)\n")
    assert proc.returncode == 2, proc.stderr
    assert "resources.resolution" in proc.stderr


def test_unexpected_error_is_one_line_with_a_log(write_config, run_python):
    """A bug is not the user's fault: exit 1, one line naming the log that holds the traceback."""
    cfg = write_config()
    proc = run_python(
        "import sys, dmad.train.preflight\n"
        "def boom(*a, **k): raise RuntimeError('kaboom')\n"
        "dmad.train.preflight.preflight = boom\n"
        "from dmad.cli import main\n"
        f"sys.exit(main(['train', '--config', {str(cfg)!r}]))\n")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("dmad: internal error: RuntimeError: kaboom (details in "), lines
    log = Path(lines[0].rsplit("(details in ", 1)[1].rstrip(")"))
    try:
        assert "Traceback" in log.read_text() and "kaboom" in log.read_text()
    finally:
        log.unlink()


def test_interrupt_exits_130_quietly(write_config, run_python):
    cfg = write_config()
    proc = run_python(
        "import sys, dmad.train.preflight\n"
        "def stop(*a, **k): raise KeyboardInterrupt\n"
        "dmad.train.preflight.preflight = stop\n"
        "from dmad.cli import main\n"
        f"sys.exit(main(['train', '--config', {str(cfg)!r}]))\n")
    assert proc.returncode == 130 and proc.stderr == "", proc.stderr


def test_help_still_works(dmad_cli):
    proc = dmad_cli("train", "--help")
    assert proc.returncode == 0 and "--config" in proc.stdout and proc.stderr == ""


def test_dry_run_prints_resolved_config_and_ledger(tmp_path, write_config, capsys):
    from tests.conftest import dmad_captured

    cfg = write_config()  # in this process (the app's config panel test runs the real engine's dry run)
    code, out, err = dmad_captured(capsys, "train", "--config", str(cfg), "--dry-run", "--set",
                                   "optimization.generator_lr=2e-5")
    assert code == 0, err
    start = out.index("{")
    resolved, end = json.JSONDecoder().raw_decode(out[start:])
    assert resolved["resources"]["resolution"] == 32
    assert resolved["optimization"]["generator_lr"] == 2e-5
    assert resolved["distillation"]["student_steps"] == 1  # a default, filled in
    assert Path(resolved["identity"]["train_data_dir"]).is_absolute()
    report = out[start + end:]
    assert any("total" in line.lower() for line in report.splitlines()), report
    assert str(tmp_path / "runs" / "tiny") in report
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


# ------------------------------------------------------------ what preflight accepts (in-process: fast)

def _preflight(config: Path, **kwargs):
    from dmad.contract.config import load_config
    from dmad.train.preflight import preflight

    return preflight(load_config(config), **kwargs)


def _fake_checkpoints(run: Path, iters: list[int], latest: int | None = None) -> None:
    """Checkpoints whose files are all there and whole (what resume verifies before it picks one),
    holding one-number weights: enough to choose a resume target, not to train from."""
    import torch
    from safetensors.torch import save_file

    from dmad.models.checkpoint import FORMAT_VERSION
    from dmad.models.optim_state import save_optimizer

    w = torch.zeros(1)
    for it in iters:
        ckpt = run / "checkpoints" / f"iter_{it}"
        for name in ("student", "fake_score"):
            (ckpt / name).mkdir(parents=True)
            save_file({"w": w}, str(ckpt / name / "diffusion_pytorch_model.safetensors"))
        for name in ("gan_head", "rng"):
            save_file({"w": w}, str(ckpt / f"{name}.safetensors"))
        for name in ("generator", "critic"):
            save_optimizer(torch.optim.SGD([torch.nn.Parameter(w)], lr=1.0), ckpt / f"optimizer_{name}.safetensors")
        (ckpt / "training_state.json").write_text(json.dumps({
            "format_version": FORMAT_VERSION, "iter": it, "generator_steps": 0, "batches_used": 0,
            "student_timesteps": [999], "prediction_type": "epsilon", "config_fingerprint": "x",
            "lr_generator": {}, "lr_critic": {}}))
    (run / "config.json").write_text("{}\n")
    if latest is not None:
        (run / "checkpoints" / "latest.json").write_text(json.dumps({"iter": latest, "path": f"iter_{latest}"}))


def test_resume_targets(tmp_path, write_config):
    from dmad.errors import UserInputError

    config, run = write_config(), tmp_path / "runs" / "tiny"
    _fake_checkpoints(run, [2, 4], latest=4)
    pf = _preflight(config, resume="latest")
    assert (pf.run_dir, pf.resume.iteration, pf.resume_arg) == (run, 4, str(run / "checkpoints" / "iter_4"))
    # A checkpoint path names its run folder; the run's name in the config does not matter.
    other = write_config({"identity": {"run_name": "elsewhere"}}, name="other.json")
    pf = _preflight(other, resume=str(run / "checkpoints" / "iter_2"))
    assert (pf.run_dir, pf.resume.iteration) == (run, 2)
    pf = _preflight(other, resume=str(run))  # a run folder: its latest checkpoint
    assert pf.resume.iteration == 4
    dated = write_config({"identity": {"run_name": None}}, name="dated.json")
    with pytest.raises(UserInputError, match="--resume latest needs the run folder"):
        _preflight(dated, resume="latest")
    assert _preflight(dated, run_dir=run, resume="latest").resume.iteration == 4


def test_run_folder_names(tmp_path, write_config):
    pf = _preflight(write_config({"identity": {"run_name": None}}))
    assert pf.run_dir.parent == tmp_path / "runs" and pf.resume is None
    assert pf.run_dir.name.startswith("dmad_") and pf.run_dir.name.endswith("_squares_tiny-v1")
    (tmp_path / "mine").mkdir()  # an empty folder the user made for the run is fine
    assert _preflight(write_config(), run_dir=tmp_path / "mine").run_dir == tmp_path / "mine"


def test_data_summary_counts_images_and_captions(tmp_path):
    from dmad.errors import UserInputError
    from dmad.train.preflight import summarize_data

    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("a.png", "b.JPG", "c.webp"):
        (folder / name).write_bytes(b"")
    with pytest.raises(UserInputError, match=r"data: 3 images but no \.txt captions"):
        summarize_data(folder)
    (folder / "a.txt").write_text("a cat")
    (folder / "notes.txt").write_text("not a caption")
    s = summarize_data(folder)
    assert (s.images, s.captioned, s.dataset_id) == (3, 1, "data")


def test_dry_run_needs_no_weights_and_shows_the_resume_point(tmp_path, write_config, tiny_teacher, capsys):
    from dmad.cli import main

    config = write_config({"identity": {"pretrained_model_name_or_path": str(_weightless(tmp_path, tiny_teacher))}})
    assert main(["train", "--config", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "weights missing: a real run needs them" in out and "total" in out
    _fake_checkpoints(tmp_path / "runs" / "tiny", [3])
    assert main(["train", "--config", str(config), "--dry-run", "--resume", "latest"]) == 0
    out = capsys.readouterr().out
    assert f"Resume from: {tmp_path / 'runs' / 'tiny' / 'checkpoints' / 'iter_3'}" in out
    assert json.loads(out[out.index("{"):out.index("\n}\n") + 2])["observation"]["resume_from_checkpoint"] == "latest"
