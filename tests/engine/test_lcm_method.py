"""Latent consistency distillation's maths (dmad.methods.lcm) against hand-computed numbers and
against diffusers' own scheduler code, on CPU."""
from __future__ import annotations

import math

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, LCMScheduler

from dmad.contract.config import Distillation
from dmad.contract.methods import lcm_grid
from dmad.methods.lcm import (TargetEMA, boundary_scalings, consistency_output, loss_consistency, sample_solver_steps,
                              solver_grid)
from dmad.methods.prediction import ddim_step
from dmad.methods.noise import SampleRNG
from dmad.methods.prediction import FlowSchedule, NoiseSchedule

SD = dict(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)


def test_the_consistency_loss_against_a_hand_computed_example():
    pred = torch.tensor([[0.0, 0.003], [1.0, -2.0]])
    target = torch.tensor([[0.004, 0.003], [0.0, -2.0]])
    loss, logs = loss_consistency(pred, target, huber_c=0.001)
    # elementwise sqrt(d^2 + c^2) - c: d = 0.004 -> sqrt(1.7e-5) - 0.001; d = 0 -> 0; d = 1 -> sqrt(1 + 1e-6) - 0.001
    want = (math.sqrt(0.004 ** 2 + 1e-6) - 0.001 + 0.0 + math.sqrt(1 + 1e-6) - 0.001 + 0.0) / 4
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert logs == {"loss_lcm": pytest.approx(want, rel=1e-6)}
    # small differences are (almost) squared, large ones (almost) absolute: the point of pseudo-Huber
    small, _ = loss_consistency(torch.tensor([1e-5]), torch.tensor([0.0]), 0.001)
    assert small.item() == pytest.approx(1e-10 / (2 * 0.001), rel=1e-2)  # float32 rounding


def test_the_l2_consistency_loss_is_the_mean_squared_error():
    pred = torch.tensor([[0.0, 0.003], [1.0, -2.0]])
    target = torch.tensor([[0.004, 0.003], [0.0, -0.5]])
    loss, logs = loss_consistency(pred, target, huber_c=0.001, loss_type="l2")
    want = (0.004 ** 2 + 0.0 + 1.0 + 1.5 ** 2) / 4  # F.mse_loss, as the scripts' --loss_type l2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert logs == {"loss_lcm": pytest.approx(want, rel=1e-6)}
    huber, _ = loss_consistency(pred, target, huber_c=0.001)  # the default stays pseudo-Huber: nearly |d|
    assert huber.item() == pytest.approx((0.004 + 1.0 + 1.5) / 4, abs=2e-3)
    with pytest.raises(ValueError, match="unknown LCM loss type 'l1'"):
        loss_consistency(pred, target, 0.001, "l1")


def test_boundary_conditions_make_f_the_identity_at_t_0_and_the_x0_prediction_at_large_t():
    t = torch.tensor([0, 1, 999])
    c_skip, c_out = boundary_scalings(t, ndim=4)
    assert c_skip.shape == (3, 1, 1, 1)
    # sigma_data 0.5, timestep_scaling 10: c_skip = 0.25 / ((10 t)^2 + 0.25), c_out = 10 t / sqrt((10 t)^2 + 0.25)
    assert c_skip.flatten().tolist() == pytest.approx([1.0, 0.25 / 100.25, 0.25 / (9990 ** 2 + 0.25)])
    assert c_out.flatten().tolist() == pytest.approx([0.0, 10 / math.sqrt(100.25), 9990 / math.sqrt(9990 ** 2 + 0.25)])
    x_t, x0 = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    f = consistency_output(x_t, x0, t)
    assert torch.equal(f[0], x_t[0])
    assert torch.allclose(f[2], x0[2], atol=1e-6)


def test_the_solver_grid_and_sampling_timesteps_are_diffusers():
    assert solver_grid(50).tolist() == lcm_grid(50) == [20 * k - 1 for k in range(1, 51)]
    sched = LCMScheduler(**SD)
    for n in (1, 2, 3, 4):
        sched.set_timesteps(n, original_inference_steps=50)
        assert Distillation(method="lcm", student_steps=n).resolved_student_timesteps() == sched.timesteps.tolist()
    # DMAD keeps its own even spacing
    assert Distillation(student_steps=4).resolved_student_timesteps() == [999, 749, 499, 249]


def test_lcm_student_timesteps_off_the_solver_grid_are_refused():
    with pytest.raises(ValueError, match=r"grid of 50 timesteps.*\[749\] are not \(nearest \[739\]\)"):
        Distillation(method="lcm", student_steps=2, student_timesteps=[999, 749])
    assert Distillation(method="lcm", student_steps=2, student_timesteps=[999, 739]).resolved_student_timesteps() \
        == [999, 739]


def test_solver_steps_are_one_grid_step_apart_and_the_first_lands_on_0():
    rng = SampleRNG(0, list(range(4000)))
    t, t_prev = sample_solver_steps(4000, 50, rng, "cpu")
    grid = set(lcm_grid(50))
    assert set(t.tolist()) == grid  # every grid point drawn
    assert torch.equal(t_prev, (t - 20).clamp(min=0))
    assert set(t_prev[t == 19].tolist()) == {0}
    # the same positions give the same draws (resume needs no RNG state)
    again, _ = sample_solver_steps(4000, 50, SampleRNG(0, list(range(4000))), "cpu")
    assert torch.equal(t, again)


def test_the_ddim_step_is_diffusers_ddim_with_eta_0():
    ddim = DDIMScheduler(**SD, clip_sample=False, set_alpha_to_one=False)
    ddim.set_timesteps(50)  # prev = t - 20, as LCM's solver
    schedule = NoiseSchedule(ddim.alphas_cumprod, "epsilon")
    gen = torch.Generator().manual_seed(0)
    x_t, eps = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 4, 8, 8, generator=gen)
    for t in (519, 999, 39):
        tt = torch.full((2,), t)
        x0 = schedule.to_x0(x_t, eps, tt)
        want = ddim.step(eps, t, x_t, eta=0.0).prev_sample
        got = ddim_step(x_t, x0, tt, tt - 20, schedule)
        assert torch.allclose(got, want, atol=1e-5), t


@pytest.mark.parametrize("schedule", [NoiseSchedule(DDPMScheduler(**SD).alphas_cumprod, "epsilon"),
                                      FlowSchedule(1000, shift=3.0)], ids=["ddpm", "flow"])
def test_a_perfect_teacher_steps_exactly_onto_the_same_noise_path(schedule):
    """With the true x0, DDIM keeps the same noise: x_prev == add_noise(x0, noise, t_prev), for a
    DDPM schedule and for rectified flow (where it is the ODE's Euler step)."""
    gen = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(3, 4, 8, 8, generator=gen), torch.randn(3, 4, 8, 8, generator=gen)
    t, t_prev = torch.tensor([999, 519, 19]), torch.tensor([979, 499, 0])
    x_t = schedule.add_noise(x0, noise, t)
    assert torch.allclose(ddim_step(x_t, x0, t, t_prev, schedule), schedule.add_noise(x0, noise, t_prev), atol=1e-5)


def test_the_target_is_a_constant_rate_ema_and_swapping_it_in_puts_the_student_back():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    target = TargetEMA([p], decay=0.95)
    with torch.no_grad():
        p.copy_(torch.tensor([3.0, 0.0]))
    target.step([p])
    # theta^- = 0.95 theta^- + 0.05 theta
    assert target.shadow[0].tolist() == pytest.approx([0.95 * 1 + 0.05 * 3, 0.95 * 2 + 0.05 * 0])
    seen = []
    with pytest.raises(RuntimeError):
        with target.swapped_in([p]):
            seen.append(p.detach().clone())
            raise RuntimeError("the target's forward failed")
    assert seen[0].tolist() == pytest.approx([1.1, 1.9])
    assert p.tolist() == [3.0, 0.0] and p.requires_grad
    # decay 0: the target is the student itself after each step (the LCM-LoRA scripts' choice)
    t0 = TargetEMA([p], decay=0.0)
    with torch.no_grad():
        p.add_(1.0)
    t0.step([p])
    assert t0.shadow[0].tolist() == [4.0, 1.0]


def test_the_memory_ledger_of_an_lcm_run_has_no_critic_and_counts_the_target():
    from dmad.contract.config import load_config
    from dmad.contract.paths import resource
    from dmad.memory.ledger import config_ledger, ledger_total

    dmad = config_ledger(load_config(resource("configs", "demo.json")))
    lcm = config_ledger(load_config(resource("configs", "demo_lcm.json")))
    names = [x.name for x in lcm]
    assert "LCM target (EMA of the student)" in names
    assert not [n for n in names if n.startswith("fake score") or n == "GAN head"]
    student = next(x for x in lcm if x.name.startswith("student"))
    target = next(x for x in lcm if x.name.startswith("LCM target"))
    # fp32 weights + grads + 2 AdamW states = 16 bytes per parameter; the target 2 x 4 bytes
    assert target.gib == pytest.approx(student.gib / 2)
    act = {x.name: x for x in dmad}["activations"], {x.name: x for x in lcm}["activations"]
    assert act[1].gib == pytest.approx(act[0].gib / 2) and "1 transformer graph," in act[1].assumption
    assert ledger_total(lcm) < ledger_total(dmad)


def test_an_lcm_config_refuses_a_dmad_checkpoint_in_one_line(tmp_path):
    import json
    from types import SimpleNamespace

    from dmad.errors import CheckpointUnusable
    from dmad.methods import lcm
    from dmad.models.checkpoint import FORMAT_VERSION, verify_checkpoint

    ckpt = tmp_path / "iter_2"
    ckpt.mkdir()
    (ckpt / "training_state.json").write_text(json.dumps({
        "format_version": FORMAT_VERSION, "iter": 2, "generator_steps": 1, "batches_used": 2,
        "student_timesteps": [999, 759, 499, 259], "prediction_type": "epsilon", "config_fingerprint": "x",
        "lr_generator": {}, "lr_critic": {}}))
    (ckpt / "gan_head.safetensors").write_bytes(b"")  # what only a DMAD checkpoint has
    with pytest.raises(CheckpointUnusable, match=r"is from a DMAD run \(distillation.method dmad\); this config is "
                                                 r"method lcm$"):
        verify_checkpoint(ckpt, lcm.UNIT.layout(SimpleNamespace(student="full", fake_score="full")))
