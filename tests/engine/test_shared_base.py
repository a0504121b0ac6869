"""One frozen base for teacher, student and fake score (dmad.models.shared_base): the views compute
what separate copies compute, bit for bit; gradients reach only the active adapter; gradient
checkpointing recomputes with the adapter of the forward; and a shared-base run writes the same
checkpoint as a separate-copies run, in every family."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.models.families import Cond  # noqa: E402
from dmad.testing.tiny import (make_tiny_flux_pipeline, make_tiny_sd3_pipeline, make_tiny_sd_pipeline,  # noqa: E402
                               make_tiny_sdxl_pipeline)

BUILDERS = {"sd": make_tiny_sd_pipeline, "sdxl": make_tiny_sdxl_pipeline, "sd3": make_tiny_sd3_pipeline,
            "flux": make_tiny_flux_pipeline}


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shared_base_teachers")
    for name, build in BUILDERS.items():
        build(root / name)
    return {name: root / name for name in BUILDERS}


def _both(teacher_path: Path, gradient_checkpointing: bool = False):
    """(teacher, separate Networks, shared Networks) from the same seed; the shared networks sit on
    their own loaded teacher (make_networks puts the adapters on the denoiser it is given)."""
    from dmad.methods.dmd2 import make_networks
    from dmad.models.networks import TeacherCopies
    from dmad.models.teacher import load_teacher

    out = []
    for share in (False, True):
        teacher = load_teacher(str(teacher_path))
        torch.manual_seed(7)
        copies = TeacherCopies(teacher.denoiser, lora_rank=4, lora_alpha=None,
                               gradient_checkpointing=gradient_checkpointing, family=teacher.family,
                               share_frozen_base=share)
        nets = make_networks(copies, student="lora", fake_score="lora", gan_on_teacher=False, ema_decay=None)
        out.append((teacher, nets))
    return out


def _inputs(teacher, seed: int = 0):
    fam = teacher.family
    g = torch.Generator().manual_seed(seed)
    cfg = teacher.denoiser.config
    channels = cfg.in_channels if fam.name != "flux" else cfg.in_channels // 4
    x = torch.randn((2, channels, 16, 16), generator=g)
    t = torch.tensor([999, 400])
    with torch.no_grad():
        emb = fam.encode(teacher.modules, ["a red square", "a blue circle"], "cpu")
    return x, t, emb, fam.schedule(teacher.scheduler, 32)


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_views_compute_what_separate_copies_compute(family, teachers):
    (t_sep, sep), (t_sh, sh) = _both(teachers[family])
    fam = t_sep.family
    x, t, emb, schedule = _inputs(t_sep)
    # the same adapter tensors under the same names, in the same order
    for a, b in ((sep.student, sh.student), (sep.fake_score, sh.fake_score)):
        na = [(n, p) for n, p in a.named_parameters() if p.requires_grad]
        nb = list(b.named_parameters())
        assert [n for n, _ in na] == [n for n, _ in nb] and na
        assert all(torch.equal(p, q) for (_, p), (_, q) in zip(na, nb))
    # LoRA B starts at zero: make the adapters matter before comparing outputs
    with torch.no_grad():
        for net in (sep.student, sep.fake_score, sh.student, sh.fake_score):
            for n, p in net.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.linspace(-0.05, 0.05, p.numel()).view_as(p))
    with torch.no_grad():
        plain = fam.predict(t_sep.denoiser, x, t, emb, schedule)
        assert torch.equal(fam.predict(sh.teacher_view, x, t, emb, schedule), plain)   # adapters off: the teacher
        assert torch.equal(fam.predict(t_sh.denoiser, x, t, emb, schedule), plain)  # and so at rest
        for a, b in ((sep.student, sh.student), (sep.fake_score, sh.fake_score)):
            out = fam.predict(b, x, t, emb, schedule)
            assert torch.equal(fam.predict(a, x, t, emb, schedule), out)
            assert not torch.equal(out, plain)


def test_gradients_reach_only_the_active_adapter(teachers):
    (_, _), (teacher, sh) = _both(teachers["sd"])
    fam = teacher.family
    x, t, emb, schedule = _inputs(teacher)
    fam.predict(sh.student, x, t, emb, schedule).square().mean().backward()
    assert all(p.grad is not None for p in sh.student.parameters())
    assert all(p.grad is None for p in sh.fake_score.parameters())
    assert all(p.grad is None for p in teacher.denoiser.parameters() if not p.requires_grad)
    # a frozen fake adapter (the critic during the student's update) passes gradients through only
    for p in sh.fake_score.parameters():
        p.requires_grad_(False)
    x_in = x.clone().requires_grad_(True)
    fam.predict(sh.fake_score, x_in, t, emb, schedule).square().mean().backward()
    assert x_in.grad is not None and all(p.grad is None for p in sh.fake_score.parameters())


@pytest.mark.parametrize("family", ["sd", "flux"])
def test_checkpointed_recompute_uses_the_adapter_of_its_forward(family, teachers):
    """One backward through the student and the fake score (the student's GAN term) recomputes
    blocks of both, after both calls returned: each must be recomputed with its own adapter."""
    grads = []
    for checkpointing in (False, True):
        (_, _), (teacher, sh) = _both(teachers[family], gradient_checkpointing=checkpointing)
        fam = teacher.family
        x, t, emb, schedule = _inputs(teacher)
        with torch.no_grad():
            for n, p in sh.fake_score.named_parameters():
                if "lora_B" in n:
                    p.fill_(0.02)
        x0 = fam.x0(sh.student, x, t, emb, schedule)
        fam.predict(sh.fake_score, x0, t, emb, schedule).square().mean().backward()
        grads.append([p.grad.clone() for p in (*sh.student.parameters(), *sh.fake_score.parameters())])
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*grads))


def _run(tmp: Path, teacher: Path, data: Path, prompts: Path, name: str, extra: dict, resume=None) -> Path:
    from dmad.contract.config import load_config
    from dmad.train.loop import run_training
    from tests.conftest import _deep_update, tiny_config_dict

    cfg = _deep_update(tiny_config_dict(teacher, data, prompts, tmp / "runs"), {
        "identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4, "run_name": name},
        "resources": {"train_batch_size": 1, "gradient_accumulation_steps": 2},
        "optimization": {"max_train_steps": 3, "lr_warmup_steps": 0},
        "distillation": {"student_steps": 2, "critic_updates_per_generator_update": 1, "ema_decay": 0.9},
        "observation": {"checkpointing_steps": 3, "validation_steps": 100, "log_every_steps": 1}})
    cfg = _deep_update(cfg, extra)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    run = tmp / name
    assert run_training(load_config(path), run_dir=run, resume=resume, argv=["dmad", "train"]) == 0
    return run


def _checkpoint_tensors(ckpt: Path) -> dict[str, dict]:
    from safetensors.torch import load_file

    return {f.name: load_file(str(f)) for f in sorted(ckpt.glob("*.safetensors"))}


def _losses(run: Path) -> list[dict]:
    import csv

    with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
        return [{k: v for k, v in row.items() if k == "iter" or k.startswith("loss_") or k.startswith("grad_norm")}
                for row in csv.DictReader(f)]


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_a_shared_base_run_writes_the_separate_copies_checkpoint(family, teachers, tiny_data, tiny_prompt_set,
                                                                 tmp_path):
    """Same seed, same data, 3 iterations (accumulation 2, a 2-step student, GAN on, EMA): the same
    losses and the same checkpoint files, tensor for tensor."""
    runs = {share: _run(tmp_path, teachers[family], tiny_data, tiny_prompt_set, f"share_{share}",
                        {"resources": {"share_frozen_base": share}}) for share in (False, True)}
    for share, run in runs.items():
        said = "one frozen base with the student and fake-score adapters" in (run / "logs" / "engine.log").read_text()
        assert said == share
    assert _losses(runs[True]) == _losses(runs[False]) and len(_losses(runs[True])) == 3
    a, b = (_checkpoint_tensors(runs[s] / "checkpoints" / "iter_3") for s in (False, True))
    assert set(a) == set(b) and {"student_lora.safetensors", "fake_score_lora.safetensors", "ema.safetensors"} <= set(a)
    for name in a:
        assert set(a[name]) == set(b[name]), name
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key]), (name, key)


def test_a_shared_base_run_resumes_exactly_after_a_crash(teachers, tiny_data, tiny_prompt_set, tmp_path, monkeypatch):
    """A crash at iteration 3 (after the checkpoint at 2), then --resume latest: the same iteration-4
    checkpoint as an uninterrupted run, tensor for tensor."""
    from dmad.contract.config import load_config
    from dmad.train.loop import run_training
    from tests.conftest import _deep_update

    every = {"optimization": {"max_train_steps": 4}, "observation": {"checkpointing_steps": 2}}
    whole = _run(tmp_path, teachers["sd"], tiny_data, tiny_prompt_set, "whole", every)
    monkeypatch.setenv("DMAD_FAULT", "oom:step-3")
    crashed_cfg = tmp_path / "crashed.json"
    cfg = json.loads((tmp_path / "whole.json").read_text())
    crashed_cfg.write_text(json.dumps(_deep_update(cfg, {"identity": {"run_name": "crashed"}})), encoding="utf-8")
    crashed = tmp_path / "crashed"
    assert run_training(load_config(crashed_cfg), run_dir=crashed, resume=None, argv=["dmad", "train"]) == 3
    monkeypatch.delenv("DMAD_FAULT")
    assert run_training(load_config(crashed_cfg), run_dir=crashed, resume=str(crashed / "checkpoints" / "iter_2"),
                        argv=["dmad", "train"]) == 0
    a, b = (_checkpoint_tensors(r / "checkpoints" / "iter_4") for r in (whole, crashed))
    assert set(a) == set(b)
    # rng.safetensors (the global generators) differs after any resume, shared or not: training
    # draws from per-batch generators only, so the weights and optimizer states are what must match
    for name in set(a) - {"rng.safetensors"}:
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key]), (name, key)


def test_an_offloaded_base_is_on_the_device_for_every_checkpointed_recompute(teachers):
    """teacher_cpu_offload moves the frozen base back to CPU RAM when a call ends; gradient
    checkpointing recomputes blocks in backward, after that. Where the base is, recorded instead of
    moved (this machine has no second device): every base layer must compute with it up, and it
    must be down again afterwards."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from dmad.train.build import offload_between_calls

    (_, _), (teacher, sh) = _both(teachers["sd"], gradient_checkpointing=True)
    shared, where, seen, phase = sh.shared, {"at": "cpu"}, [], {"now": "forward"}

    def move(device, within=None):
        where["at"] = "cpu" if torch.device(device).type == "cpu" else "device"
        return 1

    shared.move_frozen = move
    offload_between_calls(teacher.denoiser, torch.device("cuda"), shared)
    for m in shared.base.modules():
        if isinstance(m, BaseTunerLayer):
            m.base_layer.register_forward_pre_hook(lambda mod, a: seen.append((phase["now"], where["at"])))
    x, t, emb, schedule = _inputs(teacher)
    out = teacher.family.predict(sh.student, x, t, emb, schedule)
    assert where["at"] == "cpu"
    phase["now"] = "backward"
    out.square().mean().backward()
    recomputed = [w for p, w in seen if p == "backward"]
    assert recomputed and set(recomputed) == {"device"}
    assert where["at"] == "cpu"


def test_each_view_runs_the_base_in_its_own_mode(teachers):
    """Dropout with p > 0 (the tiny UNet's attention dropout, raised here) behaves as in separate
    copies: the teacher's calls in eval mode, the student's and fake score's in train mode."""
    (_, _), (teacher, sh) = _both(teachers["sd"])
    drops = [m for m in teacher.denoiser.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops
    for m in drops:
        m.p = 0.5
    seen = []
    drops[0].register_forward_pre_hook(lambda mod, a: seen.append(mod.training))
    x, t, emb, schedule = _inputs(teacher)
    with torch.no_grad():
        for net in (sh.student, sh.teacher_view, sh.fake_score, sh.teacher_view):
            teacher.family.predict(net, x, t, emb, schedule)
    assert seen == [True, False, True, False]


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_a_quantised_shared_base_is_the_quantised_teacher_and_keeps_fp32_adapters(precision, teachers):
    """teacher_precision int8 / fp8 on a shared base: the base's linear layers (peft's base_layer)
    are stored weight-only, the adapters' own layers stay float32 and trainable, and the teacher
    view computes what a quantised teacher without adapters computes."""
    from dmad.models.quant import WeightOnlyLinear
    from dmad.train.build import place_teacher

    (t_sep, _), (t_sh, sh) = _both(teachers["sd"])
    place_teacher(t_sep, torch.device("cpu"), torch.float32, precision, False)
    place_teacher(t_sh, torch.device("cpu"), torch.float32, precision, False, sh.shared)
    for net in (sh.student, sh.fake_score):
        params = list(net.parameters())
        assert params and all(p.dtype == torch.float32 and p.requires_grad for p in params)
    layers = [m.base_layer for m in sh.shared.layers]
    assert layers and all(isinstance(b, WeightOnlyLinear) for b in layers)
    x, t, emb, schedule = _inputs(t_sep)
    fam = t_sep.family
    with torch.no_grad():
        assert torch.equal(fam.predict(sh.teacher_view, x, t, emb, schedule), fam.predict(t_sep.denoiser, x, t, emb, schedule))
