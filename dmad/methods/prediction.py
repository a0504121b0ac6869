"""The teacher's noise schedule and prediction parameterisation, in DDPM notation.

    x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps,    a_t = alphas_cumprod[t],  t in [0, 999]

A UNet predicts one of eps ("epsilon"), v = sqrt(a_t) eps - sqrt(1 - a_t) x0 ("v_prediction",
SD 2.x 768) or x0 ("sample"). Distillation reasons in x0 (DMD2 compares real and fake x0
predictions), so everything here converts to and from x0.

Shapes: x0, x_t, noise and model outputs are (B, ...); t is a LongTensor (B,). The math runs in
float32 (a_999 ~ 0.0047 for SD, so eps -> x0 divides by sqrt(a_t) ~ 0.07: bf16 would lose ~3
significant bits there); results are cast back to the input's dtype.
"""
from __future__ import annotations

import torch

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample", "flow")


class NoiseSchedule:
    """alphas_cumprod (T,) plus the prediction type of the model it describes."""

    def __init__(self, alphas_cumprod: torch.Tensor, prediction_type: str):
        if prediction_type not in PREDICTION_TYPES[:3]:
            raise ValueError(f"unknown prediction_type {prediction_type!r}; expected one of {', '.join(PREDICTION_TYPES)}")
        if alphas_cumprod.ndim != 1:
            raise ValueError(f"alphas_cumprod must be 1-D (T,), got shape {tuple(alphas_cumprod.shape)}")
        self.alphas_cumprod = alphas_cumprod.detach().float().cpu()
        self.prediction_type = prediction_type
        self._on_device: dict[torch.device, torch.Tensor] = {}  # one copy per device, not one per call

    @classmethod
    def from_scheduler(cls, scheduler) -> "NoiseSchedule":
        """From a diffusers DDPMScheduler (or any scheduler with alphas_cumprod and a prediction_type)."""
        return cls(scheduler.alphas_cumprod, scheduler.config.prediction_type)

    @property
    def num_train_timesteps(self) -> int:
        return self.alphas_cumprod.shape[0]

    def alpha_sigma(self, t: torch.Tensor, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sqrt(a_t), sqrt(1 - a_t)), float32, shaped (B, 1, ...) to broadcast against ndim-D tensors."""
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"t must be an integer timestep tensor (B,), got {t.dtype}")
        table = self._on_device.get(t.device)
        if table is None:
            table = self._on_device.setdefault(t.device, self.alphas_cumprod.to(t.device))
        a = table[t.long()].view(-1, *([1] * (ndim - 1)))
        return a.sqrt(), (1.0 - a).sqrt()

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(a_t) x0 + sqrt(1 - a_t) noise (diffusers DDPMScheduler.add_noise)."""
        alpha, sigma = self.alpha_sigma(t, x0.ndim)
        return (alpha * x0.float() + sigma * noise.float()).to(x0.dtype)

    def to_x0(self, x_t: torch.Tensor, model_output: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The model's x0 prediction, whatever it natively predicts."""
        alpha, sigma = self.alpha_sigma(t, x_t.ndim)
        x, out = x_t.float(), model_output.float()
        if self.prediction_type == "epsilon":
            x0 = (x - sigma * out) / alpha
        elif self.prediction_type == "v_prediction":
            x0 = alpha * x - sigma * out  # v = alpha eps - sigma x0 and alpha^2 + sigma^2 = 1
        else:
            x0 = out
        return x0.to(x_t.dtype)

    def target(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """What the model should output for x_t = add_noise(x0, noise, t): the denoising-loss target."""
        if self.prediction_type == "epsilon":
            return noise
        if self.prediction_type == "sample":
            return x0
        alpha, sigma = self.alpha_sigma(t, x0.ndim)
        return (alpha * noise.float() - sigma * x0.float()).to(x0.dtype)


class FlowSchedule(NoiseSchedule):
    """Rectified flow (SD3, Flux): x_t = (1 - s_t) x0 + s_t eps, the network predicts the velocity
    v = eps - x0, so x0 = x_t - s_t v.

    t is the same integer index as for DDPM, t in [0, T): s_t = shift(t + 1) / T with the
    family's shift, shift(s) = k s / (1 + (k - 1) s) (diffusers FlowMatchEulerDiscreteScheduler:
    sigmas = timesteps / T, then shifted). t = T - 1 is pure noise (s = 1, no signal), so a
    1-step student starts from noise exactly as in DDPM. Stored as alpha = 1 - s, sigma = s.
    """

    def __init__(self, num_train_timesteps: int = 1000, shift: float = 1.0):
        if num_train_timesteps < 1 or shift <= 0:
            raise ValueError(f"need num_train_timesteps >= 1 and shift > 0, got {num_train_timesteps}, {shift}")
        s = torch.arange(1, num_train_timesteps + 1, dtype=torch.float64) / num_train_timesteps
        self.sigmas = (shift * s / (1 + (shift - 1) * s)).float()
        self.shift = float(shift)
        # alphas_cumprod only for callers that read it as "signal power": (1 - s)^2 / ((1 - s)^2 + s^2)
        a = (1 - self.sigmas) ** 2
        self.alphas_cumprod = a / (a + self.sigmas ** 2)
        self.prediction_type = "flow"
        self._on_device: dict[torch.device, torch.Tensor] = {}

    @property
    def num_train_timesteps(self) -> int:
        return self.sigmas.shape[0]

    def sigma_of(self, t: torch.Tensor) -> torch.Tensor:
        """s_t (B,) float32 on t's device."""
        table = self._on_device.get(t.device)
        if table is None:
            table = self._on_device.setdefault(t.device, self.sigmas.to(t.device))
        return table[t.long()]

    def alpha_sigma(self, t: torch.Tensor, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"t must be an integer timestep tensor (B,), got {t.dtype}")
        s = self.sigma_of(t).view(-1, *([1] * (ndim - 1)))
        return 1.0 - s, s

    def to_x0(self, x_t: torch.Tensor, model_output: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        _, sigma = self.alpha_sigma(t, x_t.ndim)
        return (x_t.float() - sigma * model_output.float()).to(x_t.dtype)

    def target(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (noise.float() - x0.float()).to(x0.dtype)


def ddim_step(x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, t_prev: torch.Tensor, schedule) -> torch.Tensor:
    """One deterministic DDIM step from t to t_prev given the (guided) x0 prediction at t:
    eps = (x_t - alpha_t x0) / sigma_t, x_prev = alpha_prev x0 + sigma_prev eps (float32).
    For a flow schedule (alpha = 1 - sigma) this is an Euler step of the flow ODE."""
    a, s = schedule.alpha_sigma(t, x_t.ndim)
    a_prev, s_prev = schedule.alpha_sigma(t_prev, x_t.ndim)
    x0 = x0.float()
    eps = (x_t.float() - a * x0) / s
    return a_prev * x0 + s_prev * eps


def guide(uncond: torch.Tensor, cond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance. Linear in the output, so it is the same rule for eps, v and x0."""
    return uncond + scale * (cond - uncond)
