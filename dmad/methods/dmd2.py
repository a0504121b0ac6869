"""DMAD: distribution matching + adversarial distillation, as in DMD2 (Yin et al. 2024).

Three networks: the frozen teacher (real score, mu_real), the fake score (mu_fake, a copy of the
teacher trained to denoise the student's samples) and the student G (1-4 steps). Per iteration
the critic (fake score + GAN head) steps; every K-th iteration the student steps too:

    student:  loss_distribution_matching(G(z), mu_real(x_t), mu_fake(x_t)) + w_g * loss_gan_generator
    critic:   loss_fake_denoising(fake(x_t'), target) + w_d * loss_gan_critic

x_t is a noised student sample; the GAN head reads the fake score's bottleneck features (the
family's feature tap: dmad.models.families.FeatureTap). Multi-step
students train on their own rollouts (backward_simulate), never on noised real images.

Every loss is `loss_<name>(...) -> (loss, logs)`: a scalar float32 tensor and a dict of python
floats for metrics.csv. The callers run the networks; these functions only do the math.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from dmad.methods.noise import fresh_noise
from dmad.methods.prediction import NoiseSchedule

StudentX0Fn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x_t, t (B,) long) -> x0


# --------------------------------------------------------------------------- losses

def loss_distribution_matching(x0_student: torch.Tensor, x0_real: torch.Tensor,
                               x0_fake: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """DMD2's distribution-matching loss (tianweiy/DMD2 sd_guidance.py, compute_distribution_matching_loss).

    x0_student (B, ...) carries the student's graph; x0_real / x0_fake are the teacher's and the
    fake score's x0 predictions from the same noised student sample, computed under no_grad.
    The KL gradient (x0_fake - x0_real) is divided per sample by mean|x - x0_real| (DMD's weighting:
    scale-free across samples and timesteps), then applied through a stop-gradient MSE whose
    gradient w.r.t. x is exactly grad / x.numel(). A sample whose teacher prediction equals it
    has a 0/0 weight; nan_to_num zeroes it, as in the reference.
    """
    if x0_student.ndim < 2:
        raise ValueError(f"x0_student must be (B, ...) with at least one non-batch dim, got {tuple(x0_student.shape)}")
    x = x0_student.float()
    with torch.no_grad():
        p_real = x - x0_real.float()
        p_fake = x - x0_fake.float()
        w = p_real.abs().flatten(1).mean(1).view(-1, *([1] * (x.ndim - 1)))  # (B, 1, ...)
        grad = torch.nan_to_num((p_real - p_fake) / w)
    loss = 0.5 * F.mse_loss(x, (x - grad).detach())
    return loss, {"loss_dm": loss.detach().item(), "dm_grad_norm": grad.abs().mean().item()}


def loss_fake_denoising(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The fake score's plain denoising loss on student samples, in its native prediction (eps / v / x0)."""
    loss = F.mse_loss(pred.float(), target.float())
    return loss, {"loss_fake": loss.detach().item()}


def loss_gan_generator(logits_fake: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Non-saturating generator loss -log sigmoid(D(G(z))) = softplus(-logit)."""
    loss = F.softplus(-logits_fake.float()).mean()
    return loss, {"loss_g_gan": loss.detach().item()}


def loss_gan_critic(logits_fake: torch.Tensor, logits_real: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Logistic critic loss: -log(1 - sigmoid(D(fake))) - log sigmoid(D(real)). 2 log 2 at chance."""
    fake, real = logits_fake.float(), logits_real.float()
    loss = F.softplus(fake).mean() + F.softplus(-real).mean()
    return loss, {"loss_d_gan": loss.detach().item(),
                  "d_real_acc": (real > 0).float().mean().item(),
                  "d_fake_acc": (fake < 0).float().mean().item()}


# --------------------------------------------------------------------------- GAN head on the UNet bottleneck

def _groups(channels: int, max_groups: int = 32) -> int:
    """Most GroupNorm groups (<= max_groups) with >= 2 channels each: at a 1x1 bottleneck a
    one-channel group has zero variance and would erase its input."""
    for g in range(min(max_groups, channels // 2), 0, -1):
        if channels % g == 0:
            return g
    return 1


class GanHead(nn.Module):
    """Bottleneck features (B, C, h, w) -> one realism logit per sample (B,), float32.

    3x3 convolutions with stride 2 and padding 1 map a side n to ceil(n / 2) >= 1 for every n >= 1,
    so one fixed set of layers serves any bottleneck (SD 1.5 at 512 px: 8x8 -> 4x4 -> 2x2; a tiny
    test UNet's 2x2 -> 1x1 -> 1x1); global average pooling then removes the remaining size.
    Cost at C = 1280, hidden = 256: ~3.5 M parameters, negligible next to the UNet.
    """

    def __init__(self, in_channels: int, hidden: int = 256):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, hidden, kernel_size=3, stride=2, padding=1),
            nn.GroupNorm(_groups(hidden), hidden),
            nn.SiLU(),
            nn.Conv2d(hidden, hidden, kernel_size=3, stride=2, padding=1),
            nn.GroupNorm(_groups(hidden), hidden),
            nn.SiLU(),
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        h = self.body(features.to(self.out.weight.dtype))
        return self.out(h.mean(dim=(2, 3))).squeeze(1).float()


# --------------------------------------------------------------------------- timesteps and student rollouts

def sample_timesteps(batch: int, min_timestep: int, max_timestep: int, device: torch.device | str,
                     generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Uniform integer timesteps in [min_timestep, max_timestep] (both inclusive), LongTensor (B,)."""
    if not 0 <= min_timestep <= max_timestep:
        raise ValueError(f"need 0 <= min_timestep <= max_timestep, got {min_timestep}, {max_timestep}")
    if hasattr(generator, "randint"):  # dmad.methods.noise.SampleRNG: one draw per sample from its own generator
        return generator.randint(min_timestep, max_timestep + 1).to(device)
    gen_device = generator.device if generator is not None else "cpu"
    t = torch.randint(min_timestep, max_timestep + 1, (batch,), generator=generator, device=gen_device)
    return t.to(device)


def sample_stop_index(num_steps: int, generator: Optional[torch.Generator] = None) -> int:
    """Which student step to train this iteration, uniform in [0, num_steps) (DMD2: one per batch)."""
    gen_device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, num_steps, (1,), generator=generator, device=gen_device).item())


def student_timestep_at(timesteps: list[int], k: int) -> int:
    """The student's timestep for step k (0 = pure noise), with a clear error out of range."""
    if not 0 <= k < len(timesteps):
        raise ValueError(f"student step {k} out of range: the student has {len(timesteps)} steps {timesteps}")
    return int(timesteps[k])


def _rollout(student_x0_fn: StudentX0Fn, noise: torch.Tensor, timesteps: list[int], steps: int,
             schedule: NoiseSchedule, generator: Optional[torch.Generator], noise_fn=None):
    """Run `steps` student steps from pure noise at timesteps[0]; each x0 is re-noised to the next
    timestep with fresh noise (noise_fn(x0), or drawn from `generator` in x0's layout). Returns
    (x, t) at step `steps` and the last x0 (None if steps == 0)."""
    fresh = noise_fn or (lambda like: fresh_noise(like, generator))
    x, x0 = noise, None
    for i in range(steps):
        t = torch.full((noise.shape[0],), timesteps[i], dtype=torch.long, device=noise.device)
        x0 = student_x0_fn(x, t)
        if i + 1 < len(timesteps):
            t_next = torch.full_like(t, timesteps[i + 1])
            x = schedule.add_noise(x0, fresh(x0), t_next).to(noise.dtype)
    t = torch.full((noise.shape[0],), timesteps[min(steps, len(timesteps) - 1)], dtype=torch.long,
                   device=noise.device)
    return x, t, x0


@torch.no_grad()
def backward_simulate(student_x0_fn: StudentX0Fn, noise: torch.Tensor, timesteps: list[int], stop_index: int,
                      schedule: NoiseSchedule, generator: Optional[torch.Generator] = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """DMD2 backward simulation: the input the student sees at step `stop_index` of its own sampler.

    Runs stop_index student steps under no_grad (cost: stop_index forwards, no activations kept)
    and returns (x_t, t (B,) long) for the step to train with gradient. Takes no data argument:
    a multi-step student trains on its own rollouts, the inputs it meets when sampling.
    """
    student_timestep_at(timesteps, stop_index)
    x, t, _ = _rollout(student_x0_fn, noise, timesteps, stop_index, schedule, generator)
    return x, t


@torch.no_grad()
def sample_student(student_x0_fn: StudentX0Fn, noise: torch.Tensor, timesteps: list[int],
                   schedule: NoiseSchedule, generator: Optional[torch.Generator] = None,
                   noise_fn=None) -> torch.Tensor:
    """The student's len(timesteps)-step sampler (same re-noising as training); returns x0.
    `noise_fn(like)`: the re-noising draw, when it must follow a pipeline's layout (Flux draws in
    its packed token layout, so an exported student reproduces these pixels)."""
    if not timesteps:
        raise ValueError("the student needs at least one timestep")
    _, _, x0 = _rollout(student_x0_fn, noise, timesteps, len(timesteps), schedule, generator, noise_fn)
    return x0
