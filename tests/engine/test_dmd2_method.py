"""The DMAD method's math on CPU: schedule conversions, the distribution-matching loss on a
Gaussian mixture whose scores are closed-form, backward simulation, GAN losses, head and tap."""
from __future__ import annotations

import inspect
import math

import pytest
import torch
from diffusers import DDPMScheduler, UNet2DConditionModel

from dmad.methods import (
    GanHead,
    NoiseSchedule,
    backward_simulate,
    guide,
    loss_distribution_matching,
    loss_fake_denoising,
    loss_gan_critic,
    loss_gan_generator,
    sample_stop_index,
    sample_student,
    sample_timesteps,
    student_timestep_at,
)
from dmad.models.families import Family


def sd_scheduler(prediction_type: str = "epsilon") -> DDPMScheduler:
    return DDPMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                         beta_end=0.012, prediction_type=prediction_type)


@pytest.fixture(scope="module")
def schedule() -> NoiseSchedule:
    return NoiseSchedule.from_scheduler(sd_scheduler())


# --------------------------------------------------------------------------- NoiseSchedule

@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
def test_schedule_round_trip_matches_diffusers(prediction_type):
    scheduler = sd_scheduler(prediction_type)
    sch = NoiseSchedule.from_scheduler(scheduler)
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(4, 4, 8, 8, generator=g), torch.randn(4, 4, 8, 8, generator=g)
    t = torch.tensor([0, 20, 500, 999])
    x_t = sch.add_noise(x0, noise, t)
    torch.testing.assert_close(x_t, scheduler.add_noise(x0, noise, t))
    target = sch.target(x0, noise, t)
    if prediction_type == "v_prediction":
        torch.testing.assert_close(target, scheduler.get_velocity(x0, noise, t))
    torch.testing.assert_close(sch.to_x0(x_t, target, t), x0, atol=1e-4, rtol=0)


def test_schedule_keeps_dtype_and_names_unknown_prediction_types(schedule):
    x0 = torch.randn(2, 4, 4, 4).bfloat16()
    t = torch.tensor([10, 900])
    assert schedule.add_noise(x0, torch.randn_like(x0), t).dtype == torch.bfloat16
    assert schedule.to_x0(x0, x0, t).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="flow_matching"):
        NoiseSchedule(torch.ones(1000), "flow_matching")


def test_cfg_is_the_same_rule_in_eps_and_x0(schedule):
    g = torch.Generator().manual_seed(1)
    x_t, eps_u, eps_c = (torch.randn(3, 4, 4, 4, generator=g) for _ in range(3))
    t = torch.tensor([100, 500, 900])
    torch.testing.assert_close(guide(eps_u, eps_c, 1.0), eps_c)
    assert torch.equal(guide(eps_u, eps_c, 0.0), eps_u)
    guided_x0 = schedule.to_x0(x_t, guide(eps_u, eps_c, 3.0), t)
    x0_of_guided = guide(schedule.to_x0(x_t, eps_u, t), schedule.to_x0(x_t, eps_c, t), 3.0)
    torch.testing.assert_close(guided_x0, x0_of_guided, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- distribution matching on a Gaussian mixture
#
# Data: D-dim isotropic Gaussian mixture, modes +-2 (all coordinates), std 0.3, weights 0.7 / 0.3.
# Noised, each component stays Gaussian: mean sqrt(a) mu_k, variance a s^2 + (1 - a), so the real
# score's x0 prediction E[x0 | x_t] is closed-form. The fake score is the same formula for the
# particles' own distribution, smoothed by a small kernel (bandwidth H): the exact E[x0 | x_t] of
# particles (+) N(0, H^2). DM training should then move the particles to the data distribution with
# per-mode std sqrt(0.3^2 - H^2) (the kernel supplies the rest).

MODES = torch.tensor([[2.0] * 4, [-2.0] * 4])
LOG_WEIGHTS = torch.tensor([0.7, 0.3]).log()
DATA_STD, H = 0.3, 0.1


def mixture_x0(x_t, t, means, std, schedule, log_weights=None):
    """E[x0 | x_t] for x0 ~ sum_k w_k N(means[k], std^2 I); x_t (B, D), means (K, D)."""
    alpha, sigma = schedule.alpha_sigma(t, 2)                      # (B, 1) each
    var_t = alpha ** 2 * std ** 2 + sigma ** 2                     # (B, 1) noised component variance
    diff = x_t[:, None, :] - alpha[:, :, None] * means[None]       # (B, K, D)
    logits = -(diff ** 2).sum(-1) / (2 * var_t)
    r = torch.softmax(logits if log_weights is None else logits + log_weights, dim=1)  # (B, K)
    per_component = means[None] + (alpha * std ** 2 / var_t)[:, :, None] * diff        # Gaussian posterior means
    return (r[:, :, None] * per_component).sum(1)


def sample_data(n, g):
    k = (torch.rand(n, generator=g) > 0.7).long()                  # 0: +2 mode (70 %), 1: -2 mode
    return MODES[k] + DATA_STD * torch.randn(n, MODES.shape[1], generator=g)


def energy_distance(x, y):
    return (2 * torch.cdist(x, y).mean() - torch.cdist(x, x).mean() - torch.cdist(y, y).mean()).item()


def train_particles(schedule, steps=300, n=256, step_size=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.Parameter(0.1 * torch.randn(n, MODES.shape[1], generator=g))   # a blob at 0, off both modes
    opt = torch.optim.SGD([x], lr=step_size * x.numel())          # d loss / dx = grad / numel
    start = x.detach().clone()
    for _ in range(steps):
        with torch.no_grad():
            t = torch.randint(20, 981, (n,), generator=g)
            x_t = schedule.add_noise(x, torch.randn(x.shape, generator=g), t)
            x0_real = mixture_x0(x_t, t, MODES, DATA_STD, schedule, LOG_WEIGHTS)
            x0_fake = mixture_x0(x_t, t, x.detach(), H, schedule)
        loss, logs = loss_distribution_matching(x, x0_real, x0_fake)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return start, x.detach(), logs


def test_distribution_matching_moves_particles_onto_the_mixture(schedule):
    start, end, logs = train_particles(schedule)
    data = sample_data(512, torch.Generator().manual_seed(9))
    d_start, d_end = energy_distance(start, data), energy_distance(end, data)
    assert d_end < d_start / 100, (d_start, d_end)   # ~1/1500 at these seeds
    # Not just "near a mode": the mixture weights and each mode's spread are matched too.
    upper = end[:, 0] > 0
    assert abs(upper.float().mean().item() - 0.7) < 0.05
    for mode, members in ((MODES[0], end[upper]), (MODES[1], end[~upper])):
        assert (members.mean(0) - mode).abs().max() < 0.05
        assert abs(members.std(0).mean().item() - math.sqrt(DATA_STD ** 2 - H ** 2)) < 0.02
    assert set(logs) == {"loss_dm", "dm_grad_norm"} and all(isinstance(v, float) for v in logs.values())


def test_distribution_matching_gradient_is_the_normalised_score_difference():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 5, 5, generator=g, requires_grad=True)
    x0_real, x0_fake = torch.randn(3, 4, 5, 5, generator=g), torch.randn(3, 4, 5, 5, generator=g)
    loss, logs = loss_distribution_matching(x, x0_real, x0_fake)
    loss.backward()
    w = (x - x0_real).abs().mean(dim=(1, 2, 3), keepdim=True).detach()     # per sample
    grad = (x0_fake - x0_real) / w                                          # points from real to fake x0
    torch.testing.assert_close(x.grad, grad / x.numel())
    assert loss.item() == pytest.approx(0.5 * grad.pow(2).mean().item(), rel=1e-5)
    assert logs["dm_grad_norm"] == pytest.approx(grad.abs().mean().item(), rel=1e-5)
    # A descent step moves x towards the teacher's prediction and away from the fake score's.
    assert ((x.grad * (x0_real - x0_fake)).sum(dim=(1, 2, 3)) < 0).all()


def test_distribution_matching_is_invariant_to_a_per_sample_scale_of_both_predictions():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 4, 4, generator=g)
    x0_real, x0_fake = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    c = torch.tensor([0.01, 1.0, 250.0]).view(3, 1, 1, 1)       # a different scale for every sample

    def grad_of(real, fake):
        xx = x.clone().requires_grad_(True)
        loss_distribution_matching(xx, real, fake)[0].backward()
        return xx.grad

    scaled = grad_of(x - c * (x - x0_real), x - c * (x - x0_fake))   # p_real, p_fake scaled by c
    torch.testing.assert_close(scaled, grad_of(x0_real, x0_fake), rtol=1e-4, atol=1e-7)


def test_distribution_matching_zeroes_a_sample_with_no_signal():
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    x0 = torch.stack([x[0].detach(), torch.zeros(3, 4, 4)])          # sample 0: p_real = p_fake = 0 -> 0/0
    loss, _ = loss_distribution_matching(x, x0, x0.clone())
    loss.backward()
    assert torch.isfinite(loss) and torch.equal(x.grad[0], torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="non-batch"):
        loss_distribution_matching(torch.zeros(4), torch.zeros(4), torch.zeros(4))


def test_fake_denoising_loss_is_float32_mse():
    pred, target = torch.randn(2, 4, 4, 4).bfloat16(), torch.randn(2, 4, 4, 4)
    loss, logs = loss_fake_denoising(pred, target)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx((pred.float() - target).pow(2).mean().item(), rel=1e-6)
    assert logs == {"loss_fake": loss.item()}


# --------------------------------------------------------------------------- backward simulation

TIMESTEPS = [999, 749, 499, 249]


class CountingStudent:
    """x0 = 0.5 x_t + t / 1000: deterministic, depends on input and timestep, counts its calls."""

    def __init__(self):
        self.calls: list[int] = []
        self.w = torch.nn.Parameter(torch.tensor(0.5))

    def __call__(self, x_t, t):
        assert t.dtype == torch.long and t.shape == (x_t.shape[0],)
        self.calls.append(int(t[0]))
        return self.w * x_t + t.view(-1, 1, 1, 1) / 1000


def test_backward_simulate_at_step_zero_is_the_noise_itself(schedule):
    noise, student = torch.randn(2, 4, 8, 8), CountingStudent()
    x, t = backward_simulate(student, noise, TIMESTEPS, 0, schedule, None)
    assert x is noise and torch.equal(t, torch.full((2,), 999)) and student.calls == []


@pytest.mark.parametrize("k", [1, 2, 3])
def test_backward_simulate_runs_k_student_steps_without_gradient(schedule, k):
    noise, student = torch.randn(2, 4, 8, 8), CountingStudent()
    x, t = backward_simulate(student, noise, TIMESTEPS, k, schedule, torch.Generator().manual_seed(0))
    assert student.calls == TIMESTEPS[:k]
    assert torch.equal(t, torch.full((2,), TIMESTEPS[k])) and t.dtype == torch.long
    assert not x.requires_grad


def test_backward_simulate_renoises_the_student_x0_to_the_next_timestep(schedule):
    noise, student = torch.randn(2, 4, 8, 8), CountingStudent()
    x, t = backward_simulate(student, noise, TIMESTEPS, 1, schedule, torch.Generator().manual_seed(7))
    with torch.no_grad():
        x0 = student(noise, torch.full((2,), 999))
    fresh = torch.randn(noise.shape, generator=torch.Generator().manual_seed(7))   # the first draw
    torch.testing.assert_close(x, schedule.add_noise(x0, fresh, t))


def test_backward_simulate_never_sees_data_and_is_seeded(schedule):
    params = list(inspect.signature(backward_simulate).parameters)
    assert params == ["student_x0_fn", "noise", "timesteps", "stop_index", "schedule", "generator"]
    real_images = torch.randn(2, 4, 8, 8)
    noise, student = torch.randn(2, 4, 8, 8), CountingStudent()
    run = lambda seed: backward_simulate(student, noise, TIMESTEPS, 3, schedule, torch.Generator().manual_seed(seed))[0]
    before = run(0)
    real_images.fill_(float("nan"))                                 # poison every "real data" tensor in reach
    after = run(0)
    assert torch.isfinite(after).all() and torch.equal(before, after)
    assert not torch.equal(run(0), run(1))
    with pytest.raises(ValueError, match="out of range"):
        backward_simulate(student, noise, TIMESTEPS, 4, schedule, None)


def test_sample_student_continues_the_same_rollout(schedule):
    noise, student = torch.randn(2, 4, 8, 8), CountingStudent()
    x0 = sample_student(student, noise, TIMESTEPS, schedule, torch.Generator().manual_seed(5))
    assert student.calls == TIMESTEPS and not x0.requires_grad
    x, t = backward_simulate(student, noise, TIMESTEPS, 3, schedule, torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(x0, student(x, t))
    one_step = sample_student(student, noise, [999], schedule, None)
    with torch.no_grad():
        torch.testing.assert_close(one_step, student(noise, torch.full((2,), 999)))


def test_timestep_helpers():
    g = torch.Generator().manual_seed(0)
    t = sample_timesteps(4096, 20, 980, "cpu", g)
    assert t.dtype == torch.long and t.min() == 20 and t.max() == 980
    assert {sample_stop_index(4, g) for _ in range(200)} == {0, 1, 2, 3}
    assert student_timestep_at(TIMESTEPS, 3) == 249
    with pytest.raises(ValueError, match="4 steps"):
        student_timestep_at(TIMESTEPS, 4)


# --------------------------------------------------------------------------- GAN

def test_gan_losses_at_chance_and_accuracies():
    zeros = torch.zeros(8)
    loss_d, logs_d = loss_gan_critic(zeros, zeros)
    loss_g, logs_g = loss_gan_generator(zeros)
    assert loss_d.item() == pytest.approx(2 * math.log(2)) and loss_g.item() == pytest.approx(math.log(2))
    assert logs_g == {"loss_g_gan": pytest.approx(math.log(2))}
    _, logs = loss_gan_critic(torch.tensor([-3.0, -1.0, 2.0, -5.0]), torch.tensor([4.0, 1.0, -1.0, 0.5]))
    assert logs["d_fake_acc"] == 0.75 and logs["d_real_acc"] == 0.75
    # The critic is pushed to raise real logits and lower fake ones; the generator to raise fake ones.
    fake, real = torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    loss_gan_critic(fake, real)[0].backward()
    assert (fake.grad > 0).all() and (real.grad < 0).all()
    fake.grad = None
    loss_gan_generator(fake)[0].backward()
    assert (fake.grad < 0).all()


@pytest.mark.parametrize("size", [1, 2, 8])
def test_gan_head_any_bottleneck_size_and_gradient_flows(size):
    torch.manual_seed(0)
    head = GanHead(64, hidden=32)
    feats = torch.randn(2, 64, size, size, requires_grad=True)
    logits = head(feats)
    assert logits.shape == (2,) and logits.dtype == torch.float32
    loss_gan_generator(logits)[0].backward()
    assert feats.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def tiny_unet() -> UNet2DConditionModel:
    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)


def test_bottleneck_tap_feeds_the_gan_head_from_the_unet_mid_block():
    unet = tiny_unet()
    family = Family()
    assert family.feature_channels(unet) == 64
    tap = family.tap(unet)
    x, t, emb = torch.randn(2, 4, 8, 8), torch.tensor([10, 500]), torch.randn(2, 5, 32)
    unet(x, t, emb)
    assert tap.features.shape == (2, 64, 4, 4)                  # one 2x downsample: 8x8 -> 4x4
    head = GanHead(family.feature_channels(unet), hidden=32)
    loss_gan_critic(head(tap.features), torch.zeros(2))[0].backward()
    assert unet.down_blocks[0].resnets[0].conv1.weight.grad.abs().sum() > 0   # reaches the UNet
    tap.remove()
    assert tap.features is None and len(unet.mid_block._forward_hooks) == 0
    unet(x, t, emb)
    assert tap.features is None


# --------------------------------------------------------------------------- the regression loss (DMD's paired loss)

def test_the_teacher_ode_grid_keeps_the_full_range_spacing():
    from dmad.methods.dmd2 import ode_grid

    assert ode_grid(999, 4) == [999, 749, 500, 250, 0]
    assert ode_grid(249, 4) == [249, 0]  # a quarter of the range: one of the four steps
    assert ode_grid(499, 25) == [499, 461, 422, 384, 345, 307, 269, 230, 192, 154, 115, 77, 38, 0]  # 13 of 25
    assert ode_grid(999, 1) == [999, 0]


class _GaussianTeacher:
    """The exact x0 predictor of data N(m, s^2) per element: E[x0 | x_t] for x_t = a x0 + sigma eps."""

    def __init__(self, m: float, s: float):
        self.m, self.s, self.calls = m, s, 0

    def x0(self, schedule, x_t, t, emb):
        self.calls += 1
        a, sig = schedule.alpha_sigma(t, x_t.ndim)
        return self.m + a * self.s ** 2 / (a ** 2 * self.s ** 2 + sig ** 2) * (x_t - a * self.m)


@pytest.mark.parametrize("flow", [True, False])
def test_the_teacher_ode_takes_noise_to_the_data_it_was_fitted_to(schedule, flow):
    """On Gaussian data the probability-flow ODE maps noise z to m + s z: the regression target is
    where the teacher's own deterministic sampler goes, in DDPM and flow conventions, and it gets
    there as a first-order solver does (4x the steps, about a quarter of the error)."""
    from dmad.methods.dmd2 import teacher_ode_x0
    from dmad.methods.prediction import FlowSchedule

    sched = FlowSchedule() if flow else schedule
    z = torch.randn(4, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    a, sig = sched.alpha_sigma(torch.tensor([999]), 4)
    # x_t ~ N(a m, a^2 s^2 + sigma^2) at t = 999 (a = 0 for flow; a DDPM latent keeps a trace of x0)
    expected = 0.7 + 0.3 * (z - a * 0.7) / torch.sqrt(a ** 2 * 0.3 ** 2 + sig ** 2)
    errors = []
    for steps in (200, 800):
        teacher = _GaussianTeacher(m=0.7, s=0.3)
        errors.append((teacher_ode_x0(teacher, sched, z, 999, None, steps) - expected).abs().max().item())
        assert teacher.calls == steps  # one x0 prediction a step; the last one (before t = 0) is the target
    assert errors[1] < 0.03 and errors[1] < errors[0] / 2.5, errors


def test_the_regression_loss_pulls_the_student_onto_the_teacher_target():
    from dmad.methods.dmd2 import loss_regression

    x = torch.zeros(2, 4, 8, 8, requires_grad=True)
    target = torch.full((2, 4, 8, 8), 0.5)
    loss, logs = loss_regression(x, target)
    loss.backward()
    assert loss.item() == pytest.approx(0.25) and logs == {"loss_reg": pytest.approx(0.25)}
    assert torch.allclose(x.grad, torch.full_like(x, -2 * 0.5 / x.numel()))


# --------------------------------------------------------------------------- the guidance interval

class _Family:
    """Marks which prediction each sample got: 1 the plain conditional, 2 the guided; records the
    conditioning rows each call saw."""

    def __init__(self, embedded: bool = False):
        self.embedded, self.calls = embedded, []

    def guidance_embedded(self, net):
        return self.embedded

    def x0(self, net, x_t, t, cond, schedule, guidance=None):
        self.calls.append(("plain", cond["emb"][:, 0, 0].tolist(), guidance))
        return torch.ones_like(x_t)

    def guided_x0(self, net, x_t, t, cond, uncond, scale, schedule):
        self.calls.append(("guided", cond["emb"][:, 0, 0].tolist(), scale))
        return torch.full_like(x_t, 2.0)


@pytest.mark.parametrize("embedded", [False, True])
def test_the_guidance_interval_guides_only_up_to_its_timestep(schedule, embedded):
    from dmad.methods.unit import RealScore
    from dmad.models.families import Cond

    family = _Family(embedded)
    real = RealScore(unet=None, uncond=None, guidance=3.0, family=family)
    x_t = torch.zeros(4, 2, 4, 4)
    t = torch.tensor([950, 100, 801, 800])
    emb = Cond({"emb": torch.arange(4.0).view(4, 1, 1).expand(4, 3, 5)})
    out = real.x0(schedule, x_t, t, emb, guided_up_to=800)
    assert [float(out[i].mean()) for i in range(4)] == [1.0, 2.0, 1.0, 2.0]
    assert family.calls == [("plain", [0.0, 2.0], 1.0 if embedded else None), ("guided", [1.0, 3.0], 3.0)]
    family.calls.clear()
    assert float(real.x0(schedule, x_t, t, emb).mean()) == 2.0  # no interval: one guided call, as before
    assert family.calls == [("guided", [0.0, 1.0, 2.0, 3.0], 3.0)]
