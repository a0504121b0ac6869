"""Latent consistency distillation (LCM; Luo et al. 2023), the peer method DMAD is measured against.

Follows diffusers' reference scripts (examples/consistency_distillation/train_lcm_distill_*.py):

    x_{t_{n+k}} = add_noise(x0, eps, t_{n+k})              t_{n+k} on the solver's grid (19, 39, ..., 999)
    x^_{t_n}    = DDIM(x_{t_{n+k}}, guided teacher)         one skipping step with classifier-free guidance
    f(x, t)     = c_skip(t) x + c_out(t) x0_theta(x, t)     boundary conditions: f(x, 0) = x
    loss        = mean( d(f_theta(x_{t_{n+k}}, t_{n+k}), f_target(x^_{t_n}, t_n)) )
                  d = squared error ("l2", the scripts' default) or pseudo-Huber sqrt(.^2 + c^2) - c

with the target network an EMA of the student (theta^- <- mu theta^- + (1 - mu) theta after each
student step). c_skip = s_d^2 / ((10 t)^2 + s_d^2), c_out = 10 t / sqrt((10 t)^2 + s_d^2), s_d = 0.5
(timestep_scaling 10, as the scripts).

The teacher's guidance scale is fixed (distillation.real_guidance_scale): the scripts sample
w ~ U[w_min, w_max] and, for a full student, feed it to the UNet through a guidance embedding
(time_cond_proj_dim); a network without that input (every teacher family here, and the
LCM-LoRA scripts' students) cannot be told w, so one w is the faithful choice.

Everything is written in x0 / noise terms with the schedule's (alpha_t, sigma_t), so the same code
serves a DDPM teacher (x_t = sqrt(a) x0 + sqrt(1 - a) eps) and a flow teacher (x_t = (1 - s) x0
+ s eps), where the DDIM step is the Euler step of the flow ODE. Pure torch maths, no I/O.
Shapes: latents (B, C, h, w); timesteps LongTensor (B,).
"""
from __future__ import annotations

import contextlib

import torch

TIMESTEP_SCALING = 10.0
SIGMA_DATA = 0.5


def solver_grid(num_ddim_timesteps: int, num_train_timesteps: int = 1000, device=None) -> torch.Tensor:
    """(N,) ascending: k * (T // N) - 1 for k = 1 .. N (diffusers' DDIMSolver.ddim_timesteps)."""
    step = num_train_timesteps // num_ddim_timesteps
    return torch.arange(1, num_ddim_timesteps + 1, device=device, dtype=torch.long) * step - 1


def sample_solver_steps(b: int, num_ddim_timesteps: int, gen, device,
                        num_train_timesteps: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_{n+k}, t_n) per sample: a uniform grid index, its timestep and the one a solver step below
    (clamped at 0: the first grid point's step lands on t = 0, where f is the identity)."""
    grid = solver_grid(num_ddim_timesteps, num_train_timesteps, device)
    if hasattr(gen, "randint") and not isinstance(gen, torch.Generator):  # SampleRNG: one draw per sample
        index = gen.randint(0, num_ddim_timesteps).to(device)
    else:
        index = torch.randint(0, num_ddim_timesteps, (b,), generator=gen).to(device)
    start = grid[index]
    prev = (start - num_train_timesteps // num_ddim_timesteps).clamp(min=0)
    return start, prev


def boundary_scalings(t: torch.Tensor, ndim: int, timestep_scaling: float = TIMESTEP_SCALING,
                      sigma_data: float = SIGMA_DATA) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_skip, c_out) float32, shaped (B, 1, ...): diffusers' scalings_for_boundary_conditions."""
    s = t.float() * timestep_scaling
    c_skip = sigma_data ** 2 / (s ** 2 + sigma_data ** 2)
    c_out = s / (s ** 2 + sigma_data ** 2) ** 0.5
    shape = (-1, *([1] * (ndim - 1)))
    return c_skip.view(shape), c_out.view(shape)


def consistency_output(x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """f(x_t, t) = c_skip(t) x_t + c_out(t) x0 (float32)."""
    c_skip, c_out = boundary_scalings(t, x_t.ndim)
    return c_skip * x_t.float() + c_out * x0.float()


def ddim_step(x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, t_prev: torch.Tensor, schedule) -> torch.Tensor:
    """One deterministic DDIM step from t to t_prev given the (guided) x0 prediction at t:
    eps = (x_t - alpha_t x0) / sigma_t, x_prev = alpha_prev x0 + sigma_prev eps (float32)."""
    a, s = schedule.alpha_sigma(t, x_t.ndim)
    a_prev, s_prev = schedule.alpha_sigma(t_prev, x_t.ndim)
    x0 = x0.float()
    eps = (x_t.float() - a * x0) / s
    return a_prev * x0 + s_prev * eps


def loss_consistency(pred: torch.Tensor, target: torch.Tensor, huber_c: float,
                     loss_type: str = "huber") -> tuple[torch.Tensor, dict]:
    """The consistency loss of the scripts (--loss_type), elementwise in float32 and averaged:
    "huber": the pseudo-Huber mean(sqrt((pred - target)^2 + c^2) - c); "l2": the squared error
    mean((pred - target)^2) (F.mse_loss, the scripts' default). Logs: loss_lcm."""
    d = pred.float() - target.float()
    if loss_type == "l2":
        loss = torch.mean(d ** 2)
    elif loss_type == "huber":
        loss = torch.mean(torch.sqrt(d ** 2 + huber_c ** 2) - huber_c)
    else:
        raise ValueError(f"unknown LCM loss type {loss_type!r} (huber or l2)")
    return loss, {"loss_lcm": loss.detach().item()}


class TargetEMA:
    """The target network theta^-: a constant-rate EMA of the student's trainable parameters
    (diffusers' update_ema(target, online, mu)), held as shadow tensors. `swapped_in` runs a block
    with the student's parameters replaced by the shadow (for the target's no-grad forward) and
    puts the student's own back, so one network object serves both (full, LoRA or shared-base
    adapters alike)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float):
        self.decay = float(decay)
        self.shadow = [p.detach().clone() for p in params]

    @torch.no_grad()
    def step(self, params: list[torch.nn.Parameter]) -> None:
        # theta^- = mu theta^- + (1 - mu) theta
        torch._foreach_lerp_(self.shadow, [p.detach() for p in params], 1.0 - self.decay)

    def to(self, device) -> "TargetEMA":
        self.shadow = [t.to(device) for t in self.shadow]
        return self

    @contextlib.contextmanager
    def swapped_in(self, params: list[torch.nn.Parameter]):
        with torch.no_grad():
            own = [p.detach().clone() for p in params]
            for p, t in zip(params, self.shadow):
                p.copy_(t)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, t in zip(params, own):
                    p.copy_(t)
