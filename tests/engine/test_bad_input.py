"""Every invalid input: exit 2, one line on stderr naming the problem and where, no traceback,
before any model loads.

Two halves. The first runs the real CLI (`python -m dmad train ...`) in a subprocess, as a user's
script would (config errors never import torch, so most cases take ~0.3 s). The second holds the
inputs that once crashed the engine (RecursionError, ValueError 'embedded null byte',
ENAMETOOLONG, a 17 TB allocation, int('²'), ...), run in process (dmad.cli.main): milliseconds
each once torch is imported.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dmad.cli import main
from dmad.contract.config import load_config


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
    ("too_many_processes", _cfg({}, "--num-processes", "99999999999"),
     ["--num-processes 99999999999", "at most 256 a machine"]),
    ("too_many_machines", _cfg({}, "--num-machines", "99999", "--num-processes", "99999"), ["--num-machines 99999", "at most"]),
    ("port_out_of_range", _cfg({}, "--main-process-port", "99999999", "--dry-run"),
     ["--main-process-port 99999999", "1 .. 65535"]),
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


# --------------------------------------------------------------------------- inputs that once crashed the engine (in process)

DEEP_LIST = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 100_000 + "1" + "}" * 100_000
LONG_NAME = "a" * 300          # one component over NAME_MAX (255 bytes)
LONG_PATH = "/tmp/" + "ab/" * 1500  # 4,505 bytes, every component short: over PATH_MAX (4096)


def _exit_2(capsys, *argv: str) -> str:
    """Run `dmad argv...`; assert exit 2 and exactly one 'dmad: error:' line; return that line."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("dmad: error: "), err[-2000:]
    return lines[0]


def _copy_teacher(tiny_teacher: Path, tmp_path: Path) -> Path:
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_teacher, teacher)
    return teacher


def _dry_run_with_teacher(capsys, write_config, teacher: Path) -> str:
    cfg = write_config({"identity": {"pretrained_model_name_or_path": str(teacher)}})
    return _exit_2(capsys, "train", "--config", cfg, "--dry-run")


def _edit_json(f: Path, **changes) -> None:
    data = json.loads(f.read_text())
    data.update(changes)
    f.write_text(json.dumps(data))


# --------------------------------------------------------------------------- 1. deep nesting

@pytest.mark.parametrize("deep", [DEEP_LIST, DEEP_OBJECT], ids=["list", "object"])
@pytest.mark.parametrize("where", ["config", "set", "dataset_list", "prompt_set", "unet_config", "model_index",
                                   "scheduler_config"])
def test_deeply_nested_json_is_exit_2(where, deep, capsys, tmp_path, write_config, tiny_teacher):
    extra, more, name = {}, [], where
    if where == "config":
        cfg = tmp_path / "deep.json"
        cfg.write_text(deep)
        name = "deep.json"
    elif where == "set":
        more, name = ["--set", f"resources.seed={deep}"], "--set resources.seed="
    elif where in ("dataset_list", "prompt_set"):
        f = tmp_path / f"{where}.json"
        f.write_text(deep)
        extra = ({"identity": {"train_data_dir": str(f)}} if where == "dataset_list"
                 else {"observation": {"prompt_set": str(f)}})
        name = f.name
    else:
        teacher = _copy_teacher(tiny_teacher, tmp_path)
        rel = {"unet_config": "unet/config.json", "model_index": "model_index.json",
               "scheduler_config": "scheduler/scheduler_config.json"}[where]
        (teacher / rel).write_text(deep)
        extra, name = {"identity": {"pretrained_model_name_or_path": str(teacher)}}, rel
    if where != "config":
        cfg = write_config(extra)
    line = _exit_2(capsys, "train", "--config", cfg, "--dry-run", *more)
    assert name in line and "nested too deeply" in line, line


# --------------------------------------------------------------------------- 2. NUL bytes, long paths

BAD_PATHS = [("nul", "/tmp/x\x00y", "NUL byte"), ("long_name", f"/tmp/{LONG_NAME}", "255"),
             ("long_path", LONG_PATH, "4096")]
PATH_FIELDS = [("identity", "train_data_dir"), ("identity", "output_dir"), ("identity", "pretrained_model_name_or_path"),
               ("identity", "teacher_config_dir"), ("observation", "prompt_set"),
               ("observation", "resume_from_checkpoint")]


@pytest.mark.parametrize("kind,bad,words", BAD_PATHS, ids=[b[0] for b in BAD_PATHS])
@pytest.mark.parametrize("group,field", PATH_FIELDS, ids=[f for _, f in PATH_FIELDS])
def test_config_path_fields_refuse_nul_and_overlong_paths(group, field, kind, bad, words, capsys, write_config):
    cfg = write_config({group: {field: bad}})
    line = _exit_2(capsys, "train", "--config", cfg, "--dry-run")
    assert f"{group}.{field}" in line and words in line and "config.json" in line, line


@pytest.mark.parametrize("kind,bad,words", BAD_PATHS, ids=[b[0] for b in BAD_PATHS])
def test_dataset_list_folder_refuses_nul_and_overlong_paths(kind, bad, words, capsys, tmp_path, write_config):
    listing = tmp_path / "datasets.json"
    listing.write_text(json.dumps([{"id": "a", "instance_data_dir": bad}]))
    line = _exit_2(capsys, "train", "--config", write_config({"identity": {"train_data_dir": str(listing)}}),
                   "--dry-run")
    assert "datasets.json" in line and "instance_data_dir" in line and words in line, line


def _cli_path_cases(bad: str, cfg: str, run: str) -> list[tuple[str, list[str]]]:
    """(the argument, a command that passes `bad` to it)."""
    return [("--config", ["train", "--config", bad, "--dry-run"]),
            ("--run-dir", ["train", "--config", cfg, "--run-dir", bad, "--dry-run"]),
            ("--resume", ["train", "--config", cfg, "--resume", bad, "--dry-run"]),
            ("--config", ["ledger", "--config", bad]),
            ("--run", ["sample", "--run", bad]),
            ("--prompt-set", ["sample", "--run", run, "--prompt-set", bad]),
            ("--out", ["sample", "--run", run, "--out", bad]),
            ("--run", ["export", "--run", bad, "--format", "diffusers"]),
            ("--out", ["export", "--run", run, "--format", "diffusers", "--out", bad]),
            ("DATASETS_JSON|FOLDER", ["check-data", bad]),
            ("--json", ["check-data", cfg, "--json", bad]),
            ("--run-dir", ["demo", "--run-dir", bad]),
            ("--out", ["demo", "make-teacher", "--out", bad]),
            ("--config", ["probe", "--config", bad]),
            ("--config", ["cache", "--config", bad])]


@pytest.mark.parametrize("case", range(15))
@pytest.mark.parametrize("kind,bad,words", BAD_PATHS, ids=[b[0] for b in BAD_PATHS])
def test_every_path_argument_refuses_nul_and_overlong_paths(case, kind, bad, words, capsys, tmp_path, write_config):
    run = tmp_path / "run"
    run.mkdir()
    flag, argv = _cli_path_cases(bad, str(write_config()), str(run))[case]
    line = _exit_2(capsys, *argv)
    assert f"argument {flag}" in line and words in line, line


# --------------------------------------------------------------------------- 3. safetensors headers

def _rewrite_header(f: Path, change) -> None:
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    change(header)
    text = json.dumps(header).encode()
    f.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def _first_tensor(header: dict) -> dict:
    return header[next(k for k in header if k != "__metadata__")]


HEADER_CHANGES = [
    ("shape_string", lambda h: _first_tensor(h).update(shape="abc"), "shape"),
    ("shape_negative", lambda h: _first_tensor(h).update(shape=[-4]), "shape"),
    ("dtype_unknown", lambda h: _first_tensor(h).update(dtype="Q7"), "dtype"),
    ("dtype_not_text", lambda h: _first_tensor(h).update(dtype=7), "dtype"),
    ("offsets_wrong_span", lambda h: _first_tensor(h).update(data_offsets=[0, 3]), "data_offsets"),
    ("offsets_reversed", lambda h: _first_tensor(h).update(data_offsets=[8, 0]), "data_offsets"),
    ("offsets_missing", lambda h: _first_tensor(h).pop("data_offsets"), "data_offsets"),
    ("entry_not_object", lambda h: h.update(x=[1, 2]), "not an object"),
]


@pytest.mark.parametrize("change,words", [c[1:] for c in HEADER_CHANGES], ids=[c[0] for c in HEADER_CHANGES])
def test_broken_safetensors_header_names_the_file(change, words, capsys, tmp_path, write_config, tiny_teacher):
    teacher = _copy_teacher(tiny_teacher, tmp_path)
    _rewrite_header(teacher / "unet" / "diffusion_pytorch_model.safetensors", change)
    line = _dry_run_with_teacher(capsys, write_config, teacher)
    assert "unet/diffusion_pytorch_model.safetensors" in line and words in line, line


def test_header_that_is_not_json_object_names_the_file(capsys, tmp_path, write_config, tiny_teacher):
    teacher = _copy_teacher(tiny_teacher, tmp_path)
    f = teacher / "vae" / "diffusion_pytorch_model.safetensors"
    f.write_bytes((6).to_bytes(8, "little") + b"[1, 2]" + b"\0" * 64)
    line = _dry_run_with_teacher(capsys, write_config, teacher)
    assert "vae/diffusion_pytorch_model.safetensors" in line and "JSON object" in line, line


# --------------------------------------------------------------------------- 4. teacher config numbers

CONFIG_NUMBERS = [
    ("sample_size_nan", "unet/config.json", '"sample_size": NaN', "sample_size"),
    ("sample_size_inf", "unet/config.json", '"sample_size": 1e999', "sample_size"),
    ("sample_size_negative", "unet/config.json", '"sample_size": -5', "sample_size"),
    ("sample_size_zero", "unet/config.json", '"sample_size": 0', "sample_size"),
    ("sample_size_text", "unet/config.json", '"sample_size": "64"', "sample_size"),
    ("sample_size_null", "unet/config.json", '"sample_size": null', "sample_size"),
    ("latent_channels_float", "vae/config.json", '"latent_channels": 4.5', "latent_channels"),
    ("hidden_size_huge", "text_encoder/config.json", '"hidden_size": 1e30', "hidden_size"),
    ("layers_many", "text_encoder/config.json", '"num_hidden_layers": 300', "num_hidden_layers"),
    ("layers_per_block_many", "unet/config.json", '"layers_per_block": 300', "layers_per_block"),
    ("blocks_list_long", "unet/config.json", '"block_out_channels": [' + ", ".join(["32"] * 100) + "]",
     "block_out_channels"),
    ("timesteps_huge", "scheduler/scheduler_config.json", '"num_train_timesteps": 1000000000000',
     "num_train_timesteps"),
]


@pytest.mark.parametrize("rel,entry,key", [c[1:] for c in CONFIG_NUMBERS], ids=[c[0] for c in CONFIG_NUMBERS])
def test_bad_numbers_in_teacher_configs_name_file_and_key(rel, entry, key, capsys, tmp_path, write_config,
                                                          tiny_teacher):
    teacher = _copy_teacher(tiny_teacher, tmp_path)
    f = teacher / rel
    data = json.loads(f.read_text())
    data.pop(key, None)
    f.write_text(json.dumps(data)[:-1] + ", " + entry + "}")  # NaN / 1e999 as a user's file would hold them
    line = _dry_run_with_teacher(capsys, write_config, teacher)
    assert rel in line and key in line, line


# --------------------------------------------------------------------------- 5. absurd sizes allocate nothing

def test_huge_unet_is_refused_without_allocating(capsys, tmp_path, write_config, tiny_teacher):
    teacher = _copy_teacher(tiny_teacher, tmp_path)
    _edit_json(teacher / "unet" / "config.json", block_out_channels=[1_000_000, 1_000_000])
    line = _dry_run_with_teacher(capsys, write_config, teacher)
    assert str(teacher) in line and "B parameters" in line and "200 B" in line, line


def test_huge_transformer_is_refused_without_allocating(capsys, tmp_path, write_config, tiny_sd3):
    teacher = tmp_path / "sd3"
    shutil.copytree(tiny_sd3, teacher)
    _edit_json(teacher / "transformer" / "config.json", attention_head_dim=1_000_000, num_attention_heads=8)
    line = _dry_run_with_teacher(capsys, write_config, teacher)
    assert str(teacher) in line and "B parameters" in line, line


@pytest.fixture(scope="module")
def tiny_sd3(tmp_path_factory) -> Path:
    from dmad.testing.tiny import make_tiny_sd3_pipeline

    path = tmp_path_factory.mktemp("sd3") / "tiny-sd3"
    make_tiny_sd3_pipeline(path)
    return path


# --------------------------------------------------------------------------- 6. checkpoint numbers

def _fake_run(tmp_path: Path, write_config, tiny_prompt_set: Path) -> Path:
    """A run folder with a valid config.json, prompt_set.json and one checkpoint (no weights): enough
    for every check that comes before a model loads."""
    run = tmp_path / "run"
    (run / "checkpoints" / "iter_2").mkdir(parents=True)
    (run / "checkpoints" / "iter_2" / "training_state.json").write_text("{}")
    shutil.copy(write_config(), run / "config.json")
    shutil.copy(tiny_prompt_set, run / "prompt_set.json")
    return run


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading a model fails the test: every check must come first."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")
    import dmad.models.teacher
    import dmad.sample.export

    monkeypatch.setattr(dmad.models.teacher, "load_teacher", refuse)
    monkeypatch.setattr(dmad.sample.export, "load_student", refuse)


@pytest.mark.parametrize("spec", ["²", "١٢", "9" * 5000, " 2", "+2"])
@pytest.mark.parametrize("command", ["sample", "export"])
def test_checkpoint_number_is_ascii_digits(command, spec, capsys, tmp_path, write_config, tiny_prompt_set,
                                           no_model_loads):
    run = _fake_run(tmp_path, write_config, tiny_prompt_set)
    more = ["--format", "diffusers"] if command == "export" else []
    line = _exit_2(capsys, command, "--run", run, "--checkpoint", spec, *more)
    assert "--checkpoint" in line and "iteration number" in line, line


# --------------------------------------------------------------------------- 7. unusable --out, found first

NO_PROC = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc here")
IN_PROC = pytest.param("in_proc", marks=NO_PROC)


@pytest.mark.parametrize("command,case", [("sample", "below_a_file"), ("export", "below_a_file"),
                                          ("export", "existing_folder"),
                                          pytest.param("sample", "in_proc", marks=NO_PROC),
                                          pytest.param("export", "in_proc", marks=NO_PROC)])
def test_unusable_out_is_refused_before_models_load(command, case, capsys, tmp_path, write_config, tiny_prompt_set,
                                                    no_model_loads):
    """in_proc: /proc passes os.access for root, but nothing can be made there (issue 43 E4: it was an
    internal error once the models had loaded)."""
    run = _fake_run(tmp_path, write_config, tiny_prompt_set)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "taken").mkdir()
    out, words = {"below_a_file": (tmp_path / "a_file" / "out", "a_file is a file, not a folder"),
                  "existing_folder": (tmp_path / "taken", "taken already exists"),
                  "in_proc": (Path("/proc/dmad-out"), "/proc")}[case]
    more = ["--format", "diffusers", "--checkpoint", "2"] if command == "export" else ["--checkpoint", "teacher"]
    line = _exit_2(capsys, command, "--run", run, "--out", out, *more)
    assert "--out" in line and words in line, line


@pytest.fixture
def no_bench_work(monkeypatch):
    """Starting the bench's work fails the test: its outputs must be checked first."""
    import dmad.demo.bench

    def refuse(*a, **k):
        raise AssertionError("the bench started its work before its outputs were checked")
    monkeypatch.setattr(dmad.demo.bench, "run_bench", refuse)


@pytest.mark.parametrize("case", ["json_below_a_file", "json_is_a_folder", "out_below_a_file", IN_PROC])
def test_bench_outputs_are_checked_before_the_work(case, capsys, tmp_path, no_bench_work):
    """Issue 43 E3: `--json <file>/x.json` ran the whole bench (67 s quick), then failed with
    NotADirectoryError; `--out <file>/x` was an internal error."""
    (tmp_path / "a_file").write_text("x")
    args, words = {"json_below_a_file": (["--json", tmp_path / "a_file" / "x.json"], "a_file is a file, not a folder"),
                   "json_is_a_folder": (["--json", tmp_path], "is a folder, not a file"),
                   "out_below_a_file": (["--out", tmp_path / "a_file" / "o"], "a_file is a file, not a folder"),
                   "in_proc": (["--json", Path("/proc/dmad-x/x.json")], "/proc")}[case]
    line = _exit_2(capsys, "bench", "distill", "--quick", *args)
    assert args[0] in line and words in line, line
    assert not (tmp_path / "a_file").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("scale", ["nan", "inf", "0.5", "three", "-2"])
def test_bench_teacher_cfg_is_checked_before_the_work(scale, capsys, no_bench_work):
    line = _exit_2(capsys, "bench", "distill", "--quick", "--teacher-cfg", scale)
    assert f"--teacher-cfg {scale!r}" in line and "at least 1" in line, line


# --------------------------------------------------------------------------- 8. strict numbers and booleans

STRICT = [("bool_for_int", "resources", "train_batch_size", True),
          ("text_for_int", "resources", "train_batch_size", "2"),
          ("float_for_int", "optimization", "max_train_steps", 10.0),
          ("text_for_float", "optimization", "generator_lr", "1e-5"),
          ("bool_for_float", "optimization", "generator_lr", True),
          ("int_for_bool", "resources", "gradient_checkpointing", 1),
          ("text_for_bool", "resources", "cache_latents", "true"),
          ("int_for_text", "identity", "run_name", 123),
          ("bool_in_int_list", "distillation", "student_timesteps", [True])]


@pytest.mark.parametrize("group,field,value", [c[1:] for c in STRICT], ids=[c[0] for c in STRICT])
def test_config_numbers_and_booleans_are_strict(group, field, value, capsys, write_config):
    line = _exit_2(capsys, "train", "--config", write_config({group: {field: value}}), "--dry-run")
    assert "config.json" in line and f"{group}.{field}" in line, line


def test_config_version_true_is_not_version_1(capsys, write_config):
    line = _exit_2(capsys, "train", "--config", write_config({"config_version": True}), "--dry-run")
    assert "config_version true" in line, line


def test_set_values_parse_as_json_and_text_fields_keep_the_text(write_config):
    cfg = load_config(write_config(), ["resources.train_batch_size=2", "optimization.generator_lr=1",
                                       "identity.run_name=123", "resources.gradient_checkpointing=true",
                                       "identity.teacher_config_dir=null", 'identity.output_dir="out"'])
    assert cfg.resources.train_batch_size == 2 and cfg.optimization.generator_lr == 1.0
    assert cfg.identity.run_name == "123" and cfg.resources.gradient_checkpointing is True
    assert cfg.identity.teacher_config_dir is None and cfg.identity.output_dir.endswith("/out")


@pytest.mark.parametrize("item,words", [
    ("resources.gradient_checkpointing=1", "valid boolean"), ("resources.train_batch_size=true", "valid integer"),
    ("resources.train_batch_size=2.0", "valid integer"), ("optimization.generator_lr=NaN", "NaN"),
    ("resources.seed=1e999", "float64")])
def test_set_values_are_as_strict_as_the_file(item, words, capsys, write_config):
    line = _exit_2(capsys, "train", "--config", write_config(), "--set", item, "--dry-run")
    assert f"--set {item}" in line and words in line, line


# --------------------------------------------------------------------------- 9. sweep size

@pytest.mark.parametrize("sweep,words", [
    (["steps=" + ",".join(["1"] * 17)], "17 values (at most 16 per key)"),
    (["steps=" + ",".join(["1"] * 10_000)], "10000 values"),
    (["steps=1,2,3,4,5,6,7,8", "cfg=1,2,3,4,5,6,7,8,9"], "8 x 9 = 72 images (at most 64)"),
    (["steps=²"], "integers"), (["cfg=nan"], "cfg must be in [0, 100]")])
def test_sweep_size_is_capped(sweep, words, capsys, tmp_path, write_config, tiny_prompt_set, no_model_loads):
    run = _fake_run(tmp_path, write_config, tiny_prompt_set)
    line = _exit_2(capsys, "sample", "--run", run, "--checkpoint", "teacher", "--sweep", *sweep)
    assert "--sweep" in line and words in line, line


# --------------------------------------------------------------------------- 10. make-teacher state: safetensors only

def _partial(tmp_path: Path, tensors: bytes | None, state: str | None = None) -> Path:
    from dataclasses import asdict

    from dmad.demo.make_teacher import TeacherTraining

    work = tmp_path / ".t.partial"
    work.mkdir()
    (work / "state.json").write_text(state or json.dumps({"stage_done": 1, "recipe": asdict(TeacherTraining())}))
    if tensors is not None:
        (work / "state.safetensors").write_bytes(tensors)
    return work


@pytest.fixture
def no_training(monkeypatch):
    """Training the teacher fails the test: every check must come first."""
    import dmad.demo.make_teacher

    def refuse(*a, **k):
        raise AssertionError("training started before the input was checked")
    monkeypatch.setattr(dmad.demo.make_teacher, "make_teacher", refuse)


PICKLE = b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00}\x94."


@pytest.mark.parametrize("tensors,state,words", [
    (PICKLE, None, "state.safetensors: not a readable .safetensors file"),
    (None, None, "state.safetensors: missing"),
    (b"", DEEP_LIST, "state.json: JSON nested too deeply"),
    (b"", '{"stage_done": "one"}', "not a make-teacher state")], ids=["pickle", "missing", "deep", "no_stage"])
def test_make_teacher_resume_reads_only_checked_safetensors(tensors, state, words, capsys, tmp_path, no_training):
    _partial(tmp_path, tensors, state)
    (tmp_path / ".t.partial" / "state.bin").write_bytes(PICKLE)  # never read, whatever it holds
    line = _exit_2(capsys, "demo", "make-teacher", "--out", tmp_path / "t")
    assert words in line, line


@pytest.mark.parametrize("option,value,words", [("--batch", "0", "at least 1"), ("--lr", "nan", "finite"),
                                                ("--steps", "-3", "not negative"), ("--ema-decay", "2", "[0, 1]"),
                                                ("--image-size", "12", "multiple of 8")])
def test_make_teacher_options_are_checked_first(option, value, words, capsys, tmp_path, no_training):
    line = _exit_2(capsys, "demo", "make-teacher", "--out", tmp_path / "t", option, value)
    assert option in line and words in line, line
    assert not (tmp_path / ".t.partial").exists()


def test_make_teacher_log_torn_by_an_interruption_is_resumed_on_a_fresh_line(tmp_path):
    from dmad.demo.teacher_stages import log_rows, open_log

    (tmp_path / "training_log.jsonl").write_text('{"stage": "vae", "step": 0}\n{"stage": "va')
    with open_log(tmp_path) as f:
        f.write(json.dumps({"stage": "resume", "step": 2}) + "\n")
    assert log_rows(tmp_path / "training_log.jsonl") == [{"stage": "vae", "step": 0}, {"stage": "resume", "step": 2}]


# --------------------------------------------------------------------------- 11. paths inside teacher files

@pytest.mark.parametrize("name", ["../../../../etc/x.safetensors", "/etc/x.safetensors", "sub/../../x.safetensors",
                                  "model.bin", 7])
def test_shard_index_cannot_name_files_outside_its_folder(name, capsys, tmp_path, write_config, tiny_teacher):
    teacher = _copy_teacher(tiny_teacher, tmp_path)
    unet = teacher / "unet"
    (unet / "diffusion_pytorch_model.safetensors").rename(unet / "part-1.safetensors")
    index = {"weight_map": {"conv_in.weight": "part-1.safetensors", "conv_in.bias": name}}
    (unet / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    line = _dry_run_with_teacher(capsys, write_config, teacher)
    assert "diffusion_pytorch_model.safetensors.index.json" in line and "conv_in.bias" in line, line


def test_shard_index_inside_the_folder_still_works(capsys, tmp_path, write_config, tiny_teacher):
    teacher = _copy_teacher(tiny_teacher, tmp_path)
    unet = teacher / "unet"
    (unet / "shards").mkdir()
    (unet / "diffusion_pytorch_model.safetensors").rename(unet / "shards" / "part-1.safetensors")
    index = {"weight_map": {"conv_in.weight": "shards/part-1.safetensors"}}
    (unet / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    cfg = write_config({"identity": {"pretrained_model_name_or_path": str(teacher)}})
    assert main(["train", "--config", str(cfg), "--dry-run"]) == 0
    assert "Memory ledger" in capsys.readouterr().out
