"""How well a teacher keeps the data's distribution on under-specified captions, against its
guidance scale: a diagnostic on the *tuning* set (dmad.demo.bench_sets), never the held-out one.

    python bench/teacher_coverage.py [--teacher DIR] [--cfg 1,2,3,4] [--steps 50] [--captions 16] [--seeds 64]
                                     [--edges 1000,900,800] [--sde 0,1] [--full 64]

For each CFG scale (and each guidance-interval edge): the teacher's own pipeline (flow-matching
Euler) samples every under-specified caption at `seeds` noise seeds; the shipped evaluator reads
the samples; prints stated accuracy, the mean total-variation distance to the data's conditional
(and per left-out attribute), the share of needed values that appear, and the same measures on as
many real renders (the floor). Guidance sharpens a distribution: this says how much, for the scale
the demo distils with.

--edges: a guidance interval (Kynkaenniemi et al. 2024) in sampling: the scale applies only at
timesteps <= the edge (sigma x 1000; 1000 = every step, the plain pipeline); above it the pipeline
predicts the plain conditional. Implemented through the pipeline's callback_on_step_end, which sets
its guidance scale for the next step to 1 + 1e-6 above the edge (both passes still run, so the
batch layout never changes; the output is the conditional prediction to 1e-6). The distribution
matching counterpart is `distillation.real_guidance_max_timestep`.
--sde ETA,...: sample with a stochastic sampler of the same model (the reverse SDE that has
the probability-flow ODE's marginals, Euler-Maruyama on the pipeline's own sigmas): with
x_t = (1 - t) x0 + t eps, velocity v = eps - x0, eps_hat = x + (1 - t) v and the score -eps_hat / t,
diffusion g(t)^2 = 2 ETA t gives x_{t-h} = x_t - h (v + ETA eps_hat) + sqrt(2 ETA t h) z, the last
step to the x0 prediction; ETA 0 (the default) is the ODE, the pipeline's Euler. Asks whether a distance to the
data's conditional is the model's or its deterministic sampler's. Each SDE row draws its noise
from its own generator seeded 0 (flow_sde), so a row does not depend on the rows before it.
--autoguide DIR --ag W,...: autoguidance (Karras et al. 2024, "Guiding a diffusion model with a bad
version of itself"): the teacher's velocity becomes v_weak + W (v_teacher - v_weak), where the weak
model is DIR's transformer (a smaller, shorter-trained one on the same data and the teacher's own
text encoders: bench/teacher_finetune.py --fresh-layers), for the conditional and the unconditional
pass alike, so CFG then applies to the autoguided velocities (CFG 1: autoguidance alone). W 1 is
the teacher. CFG sharpens p(caption | x) at every noise level, which for a caption that leaves the
shape out still favours the shapes whose words show earliest; autoguidance pushes away from where
the weak model errs (blends of shapes) and asks nothing of the caption.
--full N: also the full-caption adherence on N full captions x 8 seeds (the bench's layout).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=None, help="a teacher folder (default: the shipped demo teacher)")
    ap.add_argument("--cfg", default="1,2,3,4")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--captions", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=64)
    ap.add_argument("--edges", default="1000", help="guidance-interval edges (timestep x 1000 of sigma), comma-separated")
    ap.add_argument("--sde", default="0", help="sampler ETAs, comma-separated: 0 the ODE (the pipeline's Euler), > 0 the SDE")
    ap.add_argument("--autoguide", default=None, help="a weak model's pipeline folder (its transformer is used)")
    ap.add_argument("--ag", default="1", help="autoguidance weights, comma-separated (1: none)")
    ap.add_argument("--full", type=int, default=0, help="full captions for adherence (x 8 seeds; 0: skip)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    import torch

    from dmad.contract.paths import resource
    from dmad.demo.bench_sampling import sample_teacher
    from dmad.demo.bench_sets import SETS, full_items, initial_noise, real_images, under_items
    from dmad.demo.coverage import coverage_summary
    from dmad.demo.evaluator import load_evaluator
    from dmad.demo.metrics import adherence, parse_caption
    from dmad.models.teacher import load_teacher
    from dmad.sample.render import latent_shape

    torch.set_num_threads(2)
    t0 = time.time()
    teacher = load_teacher(a.teacher or str(resource("demo", "teacher")), "auto", None, dtype=torch.float32)
    sset = SETS["tuning"]
    items = under_items(sset, a.captions, a.seeds)
    caps = [c for c, _, _ in items]
    shape = latent_shape(teacher.vae, 64, 64)
    noise = initial_noise(items, sset.noise_a, shape)
    full = full_items(sset, a.full, 8) if a.full else []
    full_noise = initial_noise(full, sset.noise_a, shape) if full else None
    clf = load_evaluator()
    weak = None
    if a.autoguide:
        from diffusers import SD3Transformer2DModel

        weak = SD3Transformer2DModel.from_pretrained(a.autoguide, subfolder="transformer").eval()

    def summary(images) -> dict:
        s = coverage_summary(clf.predict(images), caps)
        return {k: s[k] for k in ("stated_accuracy", "tv", "tv_by_attribute", "coverage", "all_covered")}

    real, _ = real_images(list(dict.fromkeys(caps)), a.seeds, sset.real, first=20_000)
    rows = {"real renders (floor)": summary(real)}
    etas = [float(x) for x in a.sde.split(",")]
    grid = [(float(c), int(e), eta, float(w)) for c in a.cfg.split(",") for e in a.edges.split(",") for eta in etas
            for w in a.ag.split(",")]
    for scale, edge, eta, w in grid:
        name = (f"teacher {a.steps} steps, CFG {scale:g}" + (f", guided at t <= {edge}" if edge < 1000 else "")
                + (f", SDE eta {eta:g}" if eta else "") + (f", autoguidance {w:g}" if w != 1 else ""))
        with torch.no_grad(), guidance_interval(edge), flow_sde(eta), autoguide(teacher.denoiser, weak, w):
            rows[name] = summary(sample_teacher(teacher, caps, noise, a.steps, scale, 64))
            if full:
                preds = clf.predict(sample_teacher(teacher, [c for c, _, _ in full], full_noise, a.steps, scale, 64))
                rows[name]["adherence"] = adherence(preds, [parse_caption(c) for c, _, _ in full])["all"]
        print(f"{time.time() - t0:6.0f} s  {name}: {json.dumps(rows[name])}", flush=True)
    print("| model | stated | TV | TV shape / colour / size / position / background | covered | full-caption adherence |")
    print("|---|---:|---:|---|---:|---:|")
    for name, r in rows.items():
        per = " / ".join(f"{r['tv_by_attribute'].get(k, float('nan')):.3f}"
                         for k in ("shape", "colour", "size", "position", "background"))
        adh = f"{r['adherence']:.1%}" if "adherence" in r else ""
        print(f"| {name} | {r['stated_accuracy']:.1%} | {r['tv']:.3f} | {per} | {r['coverage']:.0%}"
              f"{'' if r['all_covered'] else ' (gaps)'} | {adh} |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


@contextlib.contextmanager
def guidance_interval(edge: int):
    """While open, the demo teacher's pipeline (SD3) guides only at timesteps <= `edge`: above it the
    scale is 1 + 1e-6 (the conditional prediction; both passes still run). edge >= 1000: unchanged."""
    import diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 as sd3

    if edge >= 1000:
        yield
        return
    plain = sd3.StableDiffusion3Pipeline.__call__

    def call(self, *args, guidance_scale: float = 7.0, **kw):
        def step_end(pipe, i, t, tensors):
            ts = pipe.scheduler.timesteps
            pipe._guidance_scale = guidance_scale if float(ts[min(i + 1, len(ts) - 1)]) <= edge else OFF
            return tensors
        return plain(self, *args, guidance_scale=OFF, callback_on_step_end=step_end, **kw)

    sd3.StableDiffusion3Pipeline.__call__ = call
    try:
        yield
    finally:
        sd3.StableDiffusion3Pipeline.__call__ = plain


@contextlib.contextmanager
def flow_sde(eta: float, seed: int = 0):
    """While open (eta > 0), FlowMatchEulerDiscreteScheduler.step is the Euler-Maruyama step of the
    reverse SDE with diffusion g(t)^2 = 2 eta t that shares the flow's marginals (see --sde); noise
    from one torch generator seeded `seed`. eta 0: unchanged (the ODE)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler as F
    from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteSchedulerOutput

    if not eta:
        yield
        return
    plain, gen = F.step, torch.Generator().manual_seed(seed)

    def step(self, model_output, timestep, sample, *args, return_dict: bool = True, **kw):
        if self.step_index is None:
            self._init_step_index(timestep)
        t, t_next = float(self.sigmas[self.step_index]), float(self.sigmas[self.step_index + 1])
        v, x = model_output.float(), sample.float()
        if t_next <= 0:
            prev = x - t * v  # the x0 prediction
        else:
            h, eps_hat = t - t_next, x + (1 - t) * v
            z = torch.randn(x.shape, generator=gen, dtype=x.dtype)
            prev = x - h * (v + eta * eps_hat) + (2 * eta * t * h) ** 0.5 * z
        self._step_index += 1
        prev = prev.to(model_output.dtype)
        return FlowMatchEulerDiscreteSchedulerOutput(prev_sample=prev) if return_dict else (prev,)

    F.step = step
    try:
        yield
    finally:
        F.step = plain


@contextlib.contextmanager
def autoguide(den, weak, w: float):
    """While open (w != 1), `den`'s forward returns weak + w (den - weak) of the two models'
    predictions on the same inputs (--autoguide)."""
    if w == 1 or weak is None:
        yield
        return
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    plain = den.forward

    def forward(*args, return_dict: bool = True, **kw):
        strong = plain(*args, return_dict=False, **kw)[0]
        poor = weak(*args, return_dict=False, **kw)[0]
        out = poor + w * (strong - poor)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)

    den.forward = forward
    try:
        yield
    finally:
        del den.forward


OFF = 1.0 + 1e-6  # "no guidance" that keeps the pipeline's two-pass layout


if __name__ == "__main__":
    raise SystemExit(main())
