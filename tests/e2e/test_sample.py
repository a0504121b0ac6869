"""`dmad sample`: re-rendering a run's checkpoints and its teacher after training, the sweep grid,
and its input errors. One tiny run (trained once per module) serves every test."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import dmad_captured, dmad_in_process, run_dmad, tiny_config_dict

torch = pytest.importorskip("torch")

from dmad.cli import main  # noqa: E402
from dmad.contract.events import parse_line  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set) -> Path:
    """A 1-step student (the prompt set's teacher steps are 2) with EMA, checkpoints at 1 and 2."""
    root = tmp_path_factory.mktemp("sample_run")
    cfg = tiny_config_dict(tiny_teacher, tiny_data, tiny_prompt_set, root / "runs")
    cfg["distillation"] = {"student_steps": 1, "ema_decay": 0.9}
    cfg["observation"]["checkpointing_steps"] = 1
    (root / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert dmad_in_process("train", "--config", str(root / "config.json"), "--run-dir", str(root / "run")) == 0
    return root / "run"


def _sample(run: Path, *args: str, capsys=None) -> dict:
    """`dmad sample --run RUN ARGS`: in a process of its own as a user's script starts it, or with
    `capsys` the CLI's main() in this process (a CLI start is ~7 s of imports)."""
    if capsys is None:
        r = run_dmad("sample", "--run", str(run), *args, cwd=run.parent, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out, err = r.stdout, r.stderr
    else:
        code, out, err = dmad_captured(capsys, "sample", "--run", str(run), *args)
        assert code == 0, err[-2000:]
    events = [parse_line(line) for line in out.splitlines()]
    assert len(events) == 1 and events[0] is not None and events[0].kind == "samples"  # stdout: the event only
    assert "s/image" in err
    return events[0].data


def _pngs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}


def test_rerendering_a_checkpoint_is_byte_identical_and_never_replaces_a_folder(run, capsys):
    samples = run / "samples"
    first = _sample(run)  # --checkpoint latest, the real CLI in its own process
    second = _sample(run, "--checkpoint", "2", capsys=capsys)
    assert (first["folder"], second["folder"]) == (str(samples / "iter_2-r2"), str(samples / "iter_2-r3"))
    a, b, own = _pngs(samples / "iter_2-r2"), _pngs(samples / "iter_2-r3"), _pngs(samples / "iter_2")
    assert sorted(a) == ["blue.png", "red.png"] and a == b == own  # the training's own images, bit for bit
    meta, train_meta = (json.loads((samples / d / "meta.json").read_text()) for d in ("iter_2-r2", "iter_2"))
    # the student's own timesteps from its checkpoint, never the prompt set's 2 teacher steps
    assert meta["timesteps"] == [999] and meta["steps"] == 1 and meta["cfg"] is None
    assert meta["checkpoint"] == train_meta["checkpoint"] == "iter_2" and meta["ema"] is True
    assert meta["method"] == train_meta["method"] == "dmad"
    assert meta["weights_sha256"] == train_meta["weights_sha256"] and len(meta["weights_sha256"]) == 64
    assert meta["deterministic_algorithms"] is True and meta["items"]["blue"]["seed"] == 1
    assert first["model"] == "student" and first["checkpoint"] == "iter_2"


@pytest.mark.slow
def test_teacher_and_an_earlier_checkpoint_into_another_folder_with_another_prompt_set(run, tmp_path, capsys):
    teacher = _sample(run, "--checkpoint", "teacher", capsys=capsys)
    assert teacher["folder"] == str(run / "samples" / "teacher-r2") and teacher["model"] == "teacher"
    assert _pngs(run / "samples" / "teacher-r2") == _pngs(run / "samples" / "teacher")  # the engine's own render
    meta = json.loads((run / "samples" / "teacher-r2" / "meta.json").read_text())
    assert (meta["checkpoint"], meta["steps"], meta["sampler"], meta["iter"]) == ("teacher", 2, "ddim", None)

    other = tmp_path / "other_v3.json"
    other.write_text(json.dumps({"prompt_set": "other", "version": "v3", "resolution": [16, 16], "seed": 5,
                                 "items": [{"id": "g", "topic": "t", "prompt": "a green square"}]}))
    data = _sample(run, "--checkpoint", "1", "--prompt-set", str(other), "--out", str(tmp_path / "out"), capsys=capsys)
    assert data["folder"] == str(tmp_path / "out" / "iter_1")
    meta = json.loads((tmp_path / "out" / "iter_1" / "meta.json").read_text())
    assert (meta["prompt_set"], meta["prompt_set_version"], meta["resolution"]) == ("other", "v3", [16, 16])
    assert meta["items"] == {"g": {"prompt": "a green square", "seed": 5, "file": "g.png"}}
    from PIL import Image

    with Image.open(tmp_path / "out" / "iter_1" / "g.png") as im:
        assert im.size == (16, 16)


@pytest.mark.slow
def test_sweep_writes_a_labelled_grid_and_its_json(run, tmp_path, capsys):
    from PIL import Image

    data = _sample(run, "--sweep", "steps=1,2,4", "cfg=1,3", "--prompt-id", "blue", "--out", str(tmp_path),
                   capsys=capsys)
    grid = tmp_path / "sweep_iter_2_blue.png"
    assert data["paths"] == [str(grid)] and data["sweep"] == str(grid.with_suffix(".json"))
    doc = json.loads(grid.with_suffix(".json").read_text())
    assert doc["rows"] == {"key": "steps", "values": [1, 2, 4]} and doc["columns"] == {"key": "cfg", "values": [1.0, 3.0]}
    assert [(c["steps"], c["cfg"]) for c in doc["cells"]] == [(1, 1.0), (1, 3.0), (2, 1.0), (2, 3.0), (4, 1.0), (4, 3.0)]
    assert doc["cells"][0]["timesteps"] == [999] and doc["cells"][4]["timesteps"] == [999, 749, 499, 249]
    assert doc["prompt_id"] == "blue" and doc["seed"] == 1 and doc["method"] == "dmad"
    with Image.open(grid) as im:  # 3 rows x 2 columns of 128 px cells (32 px scaled x4) plus labels
        assert im.size[0] > 2 * 128 and im.size[1] > 3 * 128
        cells = im.convert("RGB")
    # labels are drawn: the top-left label band holds dark text pixels
    assert any(sum(cells.getpixel((x, y))) < 200 for x in range(0, 60) for y in range(0, 12))

    teacher = _sample(run, "--checkpoint", "teacher", "--sweep", "cfg=1,7.5", "--out", str(tmp_path), capsys=capsys)
    doc = json.loads(Path(teacher["sweep"]).read_text())
    assert doc["prompt_id"] == "red" and [(c["steps"], c["cfg"]) for c in doc["cells"]] == [(2, 1.0), (2, 7.5)]
    assert doc["method"] is None  # the teacher was not distilled
    again = _sample(run, "--checkpoint", "teacher", "--sweep", "cfg=1,7.5", "--out", str(tmp_path), capsys=capsys)
    assert again["paths"] == [str(tmp_path / "sweep_teacher_red-r2.png")]
    assert Path(again["paths"][0]).read_bytes() == Path(teacher["paths"][0]).read_bytes()


def test_one_off_prompt_renders_the_checkpoint_and_the_teacher_side_by_side(run, capsys):
    """The Playground's request: with the prompt set's own prompt and seed, the two images are the
    run's own samples of that prompt, bit for bit (same noise, same sampler, same timesteps)."""
    oneoff = run / "samples" / "oneoff"
    data = _sample(run, "--prompt", "a red square on a black background", "--seed", "0", capsys=capsys)
    student, teacher = (Path(p) for p in data["paths"])
    assert student.parent == teacher.parent == oneoff and data["one_off"] is True and data["seed"] == 0
    assert student.name.startswith("iter_2-") and student.name.endswith("-student.png")
    assert teacher.name == student.name.replace("-student", "-teacher")
    assert student.read_bytes() == (run / "samples" / "iter_2" / "red.png").read_bytes()
    assert teacher.read_bytes() == (run / "samples" / "teacher" / "red.png").read_bytes()
    s_meta, t_meta = (json.loads(p.with_suffix(".json").read_text()) for p in (student, teacher))
    assert s_meta["pair"] == t_meta["pair"] and s_meta["file"] == student.name
    assert (s_meta["model"], s_meta["steps"], s_meta["timesteps"], s_meta["cfg"], s_meta["iter"]) == (
        "student", 1, [999], None, 2)
    assert (t_meta["model"], t_meta["sampler"], t_meta["steps"], t_meta["checkpoint"]) == ("teacher", "ddim", 2, None)
    assert s_meta["weights_sha256"] == json.loads((run / "samples" / "iter_2" / "meta.json").read_text())["weights_sha256"]
    # the user's steps, CFG, size and negative prompt; the student alone; a second request never replaces the first
    data = _sample(run, "--checkpoint", "1", "--prompt", "a blue square", "--negative-prompt", "red", "--steps", "2",
                   "--cfg", "2", "--size", "16x24", "--seed", "9", "--no-teacher", capsys=capsys)
    (path,) = (Path(p) for p in data["paths"])
    meta = json.loads(path.with_suffix(".json").read_text())
    assert (meta["steps"], meta["timesteps"], meta["cfg"], meta["resolution"], meta["negative_prompt"]) == (
        2, [999, 499], 2.0, [16, 24], "red")
    from PIL import Image

    with Image.open(path) as im:
        assert im.size == (16, 24)
    teacher_only = _sample(run, "--checkpoint", "teacher", "--prompt", "a red square on a black background",
                           "--seed", "0", capsys=capsys)
    (again,) = teacher_only["paths"]
    assert Path(again).read_bytes() == teacher.read_bytes() and again != str(teacher)
    assert len(list(oneoff.glob("*.json"))) == len(list(oneoff.glob("*.png"))) == 4


@pytest.mark.parametrize("args, expected", [
    (["--run", "{run}", "--prompt", ""], "--prompt must be non-empty text"),
    (["--run", "{run}", "--prompt", "x", "--size", "30x30"], "--size 30x30: each side must be a multiple of 8"),
    (["--run", "{run}", "--prompt", "x", "--size", "big"], "--size 'big': expected WIDTHxHEIGHT"),
    (["--run", "{run}", "--prompt", "x", "--steps", "0"], "--steps 0: from 1 to 1000"),
    (["--run", "{run}", "--prompt", "x", "--cfg", "nan"], "--cfg nan: a number from 0 to 100"),
    (["--run", "{run}", "--prompt", "x", "--seed", "-1"], "--seed must be a whole number from 0 to 4294967295"),
    (["--run", "{run}", "--prompt", "x", "--sweep", "cfg=1"], "--prompt renders one request"),
    (["--run", "{run}", "--seed", "3"], "--seed is for --prompt (a one-off request)"),
    (["--run", "{tmp}/nope"], "--run {tmp}/nope: run folder not found"),
    (["--run", "{tmp}"], "not a run folder (no config.json)"),
    (["--run", "{run}", "--checkpoint", "7"], "--checkpoint 7: no checkpoint iter_7 in"),
    (["--run", "{run}", "--checkpoint", "best"], "expected latest, teacher or an iteration number (available: 1, 2)"),
    (["--run", "{run}", "--sweep", "steps=a"], "--sweep 'steps=a': steps values must be integers"),
    (["--run", "{run}", "--sweep", "steps"], "expected KEY=V1,V2,... with KEY one of steps, cfg"),
    (["--run", "{run}", "--sweep", "seed=1,2"], "with KEY one of steps, cfg"),
    (["--run", "{run}", "--sweep", "cfg=1", "cfg=2"], "cfg is given twice"),
    (["--run", "{run}", "--sweep", "steps=1", "cfg=1", "steps=2"], "steps is given twice"),
    (["--run", "{run}", "--sweep", "steps=0,1"], "steps must be in [1, 1000]"),
    (["--run", "{run}", "--sweep", "cfg=-1"], "cfg must be in [0, 100]"),
    (["--run", "{run}", "--sweep", "steps=1", "--prompt-id", "zzz"], "--prompt-id 'zzz': not in prompt set tiny-v1"),
    (["--run", "{run}", "--prompt-set", "{tmp}/none.json"], "prompt set file not found"),
    (["--checkpoint", "1"], "the following arguments are required: --run"),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, args, expected):
    args = [a.format(tmp=tmp_path, run=run) for a in args]
    assert main(["sample", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dmad: error: ") and err.count("\n") == 1, err
    assert expected.format(tmp=tmp_path) in err, err


def test_bad_input_from_the_real_cli_renders_nothing(run):
    before = sorted(p.name for p in (run / "samples").iterdir())
    r = run_dmad("sample", "--run", str(run), "--checkpoint", "99", cwd=run.parent)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("dmad: error: --checkpoint 99")
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert sorted(p.name for p in (run / "samples").iterdir()) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_a_gpu_is_an_input_error(run, capsys):
    assert main(["sample", "--run", str(run), "--device", "cuda"]) == 2
    assert capsys.readouterr().err == "dmad: error: --device cuda: this machine has no CUDA device torch can use\n"
