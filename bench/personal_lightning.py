"""Personal Lightning on the built-in demo (issue 40): does a few-step student distilled from
teacher + style LoRA keep the style, where a student distilled from the bare teacher with the
style LoRA stacked on it (what users do today) does not? And how does it behave when the user
changes the scales or adds a LoRA it was not distilled with (the compatibility lab)?

    python bench/personal_lightning.py --out DIR [--seeds 0] [--json OUT]

It trains, through `dmad train`, the "Personal Lightning (demo)" preset
(resources/configs/demo_personal_lightning.json: the demo teacher + resources/demo/style_lora, a
4-step LoRA student) and the same config without the teacher's LoRA (the base-distilled student),
once per training seed, kept in DIR/runs, then samples every row on the held-out set's full
captions (dmad.demo.bench_sets: captions, noise) and reads each image with the style evaluator
(resources/demo/style_evaluator): the share drawn in the LoRA's style, framed ("style"), the share
outlined (the lab's second LoRA's style) and the share with every caption attribute right
("adherence"). Intervals: 95% bootstrap over captions (each caption's
seeds stay together); the "beats" interval is over per-caption paired differences, within one
training seed, and (with several seeds) a t interval over the seeds' paired differences.
Every row is kept in DIR/rows/<name>.json: run it again and it goes on. The checkpoint rule is fixed:
each run's final checkpoint.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRESET = "demo_personal_lightning.json"
STYLE = "frame"          # the shipped style LoRA's (resources/demo/style_lora)
SECOND_STYLE = "outline"  # the lab's second user LoRA, made here by dmad demo make-lora if not given


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def caption_bootstrap(hits: np.ndarray, groups: list[list[int]], n_boot: int = 2000, seed: int = 0) -> list[float]:
    """95% percentile interval of the mean of `hits` (0/1 per image), resampling captions."""
    per = np.array([hits[g].mean() for g in groups])
    rng = np.random.default_rng(seed)
    draws = per[rng.integers(0, len(per), (n_boot, len(per)))].mean(1)
    return [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]


def t_interval(values: list[float]) -> list[float] | None:
    """95% t interval of the mean of `values` (None for fewer than 2)."""
    from dmad.demo.bench_report import t975

    if len(values) < 2:
        return None
    m, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = t975(len(values) - 1) * sd / math.sqrt(len(values))
    return [m - half, m + half]


class Bench:
    def __init__(self, out: Path, set_name: str, prompts: int, seeds_per_prompt: int, batch: int):
        import torch

        from dmad.contract.config import load_config
        from dmad.contract.paths import resource
        from dmad.demo.bench_sets import SETS, full_items, groups_of, initial_noise
        from dmad.sample.render import latent_shape

        self.out, self.batch = out, batch
        (out / "rows").mkdir(parents=True, exist_ok=True)
        self.config = resource("configs", PRESET)
        self.cfg = load_config(self.config)
        self.style_lora = self.cfg.identity.teacher_loras[0].path
        sset = SETS[set_name]
        self.items = full_items(sset, prompts, seeds_per_prompt)
        self.captions = [c for c, _, _ in self.items]
        self.groups = groups_of(self.items)
        self.real_seed = sset.real
        self.cfg_scale = self.cfg.distillation.real_guidance_scale
        self.resolution = self.cfg.resources.resolution
        bare = self.teacher(())
        shape = latent_shape(bare.vae, self.resolution, self.resolution)
        self.noise = initial_noise(self.items, sset.noise_a, shape)
        self.noise_b = initial_noise(self.items, sset.noise_b, shape)  # the reference row's: other noise, same captions
        self.settings = {"set": set_name, "prompts": prompts, "seeds_per_prompt": seeds_per_prompt,
                         "images_per_row": len(self.items), "cfg": self.cfg_scale, "config": str(self.config),
                         "style_lora": self.style_lora, "torch": torch.__version__, "threads": torch.get_num_threads()}
        self._teachers: dict = {(): bare}

    def teacher(self, loras: tuple):
        """The teacher with `loras` ((path, scale), ...) fused, cached."""
        import torch

        from dmad.contract.config import TeacherLora
        from dmad.models.teacher import load_identity_teacher

        cache = self.__dict__.setdefault("_teachers", {})
        if loras not in cache:
            ident = self.cfg.identity.model_copy(update={"teacher_loras": [TeacherLora(path=p, scale=s) for p, s in loras]})
            cache.clear()  # one teacher in memory at a time
            cache[loras] = load_identity_teacher(ident, dtype=torch.float32)
        return cache[loras]

    def row(self, name: str, render) -> dict:
        """The row `name`: kept, or rendered by `render()` ((N, 3, H, W) in [-1, 1]) and read. Its
        style-evaluator features are kept beside it (rows/<name>.npy) for the FD to the reference."""
        from dmad.demo.make_lora import read_style

        f, npy = self.out / "rows" / f"{name}.json", self.out / "rows" / f"{name}.npy"
        if f.is_file() and npy.is_file():
            return {**json.loads(f.read_text(encoding="utf-8")), "features": np.load(npy)}
        t0 = time.perf_counter()
        images = render()
        res = read_style(images, self.captions, STYLE)
        feats = res.pop("features")
        tmp = npy.with_name(f".{npy.name}.tmp.npy")
        np.save(tmp, feats.astype(np.float32))
        tmp.replace(npy)
        hits = np.array(res.pop("hits"), dtype=float)
        right = np.array(res.pop("right"), dtype=float)
        second = np.array([SECOND_STYLE in x.split("+") for x in res["styles"]], dtype=float)
        row = {"name": name, "style": res["style"], "style_ci": caption_bootstrap(hits, self.groups),
               "second_style": float(second.mean()), "second_style_ci": caption_bootstrap(second, self.groups),
               "style_counts": {k: res["styles"].count(k) for k in sorted(set(res["styles"]))},
               "adherence": res["adherence"], "adherence_ci": caption_bootstrap(right, self.groups),
               "per_attribute": res["per_attribute"], "style_hits": hits.astype(int).tolist(),
               "right": right.astype(int).tolist(), "render_s": round(time.perf_counter() - t0, 1)}
        from dmad.contract.runs import atomic_write_json

        atomic_write_json(f, row)
        log(f"{name}: style {row['style']:.1%} [{row['style_ci'][0]:.1%}, {row['style_ci'][1]:.1%}], "
            f"adherence {row['adherence']:.1%} ({row['render_s']:.0f} s)")
        return {**row, "features": feats}

    def fd_to(self, row: dict, ref: dict) -> None:
        """FD from `row` to the reference row's features (style-evaluator features: style and
        content together), with the seed-stratified interval (dmad.demo.metrics.fd_interval)."""
        from dmad.demo.metrics import fd_interval, feature_stats, frechet_distance_from_stats

        mu, cov = feature_stats(ref["features"])
        row["fd_ref"] = float(frechet_distance_from_stats(*feature_stats(row["features"]), mu, cov))
        row["fd_ref_ci"] = [float(x) for x in fd_interval(row["features"], mu, cov, groups=self.groups)]

    def real_row(self, name: str, style: str) -> dict:
        """Real renders of the rows' captions in `style`, through the teacher's VAE and back: what
        the style evaluator reads where the style is surely there (the measurement's own floor)."""
        import torch

        from dmad.demo.evaluator import real_attrs_for_captions, render_real_attrs, to_unit
        from dmad.demo.teacher_stages import decode, encode_latents

        def render():
            per = self.settings["seeds_per_prompt"]  # the items are prompt-major: each prompt's renders in its place
            attrs = [{**a, "style": style} for a in real_attrs_for_captions(self.captions[::per], per, self.real_seed)]
            vae = self.teacher(()).vae
            with torch.no_grad():
                z = encode_latents(vae, to_unit(render_real_attrs(attrs)))
                return decode(vae, (z - vae.config.shift_factor) * vae.config.scaling_factor)

        return self.row(name, render)

    def teacher_row(self, name: str, loras: tuple, steps: int, noise=None) -> dict:
        from dmad.demo.bench_sampling import sample_teacher

        noise = self.noise if noise is None else noise
        return self.row(name, lambda: sample_teacher(self.teacher(loras), self.captions, noise, steps,
                                                     self.cfg_scale, self.batch, trailing=steps < 50))

    def student_row(self, name: str, run_dir: Path, loras: tuple, student_scale: float = 1.0,
                    checkpoint: Path | None = None) -> dict:
        from dmad.demo.bench_sampling import load_student, sample_student

        def render():
            teacher = self.teacher(loras)
            student, state = load_student(run_dir, teacher, checkpoint)
            if student_scale != 1.0:
                scale_adapter(student, student_scale)
            return sample_student(student, teacher, self.captions, self.noise, list(state.student_timesteps),
                                  self.batch, self.resolution)

        return self.row(name, render)


def learning_curve(b: Bench, run_dir: Path, loras: tuple, prefix: str) -> dict:
    """Rows of every checkpoint of the run before its last, by iteration (read, never chosen)."""
    from dmad.contract.runs import RunFolder

    ckpts = sorted(RunFolder(run_dir).checkpoints_from_latest())
    return {it: b.student_row(f"curve-{prefix}-{it}", run_dir, loras, checkpoint=path) for it, path in ckpts[:-1]}


def scale_adapter(model, scale: float) -> None:
    """Every LoRA layer of `model` at `scale` times its trained alpha / r (peft's set_scale)."""
    from peft.tuners.lora import LoraLayer

    for m in model.modules():
        if isinstance(m, LoraLayer):
            for adapter in m.active_adapters:
                m.set_scale(adapter, scale)


def paired(a: dict, b: dict, key: str, groups: list[list[int]], n_boot: int = 2000) -> dict:
    """a - b of `key`'s per-image 0/1 list, with a 95% bootstrap over captions (paired: the same
    captions and noise in both rows)."""
    x, y = np.array(a[key], dtype=float), np.array(b[key], dtype=float)
    per = np.array([x[g].mean() - y[g].mean() for g in groups])
    rng = np.random.default_rng(1)
    draws = per[rng.integers(0, len(per), (n_boot, len(per)))].mean(1)
    return {"difference": float(per.mean()), "ci": [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="bench folder (kept; run again to go on)")
    p.add_argument("--seeds", default="0", help="training seeds, comma separated (default 0)")
    p.add_argument("--set", default="heldout", choices=("tuning", "heldout"))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--seeds-per-prompt", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--second-lora", type=Path, help="a second user LoRA the student was not distilled with "
                                                   "(default: made here: dmad demo make-lora --style outline)")
    p.add_argument("--no-lab", action="store_true", help="skip the compatibility lab's rows")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[;KEY=VALUE...]",
                   help="also train the preset with these overrides (repeatable; a tuning sweep: use --set tuning)")
    p.add_argument("--no-stacked", action="store_true",
                   help="skip the base-distilled student and its stacked row (a sweep of the preset alone)")
    p.add_argument("--no-preset", action="store_true",
                   help="train only the --variant runs, not the preset itself (a sweep whose variant holds the "
                        "preset's run as its first part, e.g. more iterations at a constant learning rate; "
                        "needs --no-stacked and --no-lab)")
    p.add_argument("--curve", action="store_true",
                   help="also read every Personal Lightning run's earlier checkpoints (a learning curve; never chosen)")
    args = p.parse_args(argv)
    if args.no_preset and not (args.no_stacked and args.no_lab and args.variant):
        p.error("--no-preset needs --variant, --no-stacked and --no-lab (the stacked row and the lab read the preset's run)")
    variants = {}
    for v in args.variant:
        name, _, overrides = v.partition("=")
        if not name or not overrides or not name.replace("_", "").replace("-", "").isalnum():
            p.error(f"--variant {v!r}: give NAME=KEY=VALUE[;KEY=VALUE...], NAME of letters, digits, - and _")
        variants[name] = tuple(o.strip() for o in overrides.split(";") if o.strip())

    from dmad.demo.bench_runs import Method, train

    t0 = time.perf_counter()
    b = Bench(args.out, args.set, args.prompts, args.seeds_per_prompt, args.batch)
    style = ((b.style_lora, 1.0),)
    # the reference: what the user gets from teacher + LoRA at 50 steps, on another noise set
    reference = b.teacher_row("teacher-lora-50-noise-b", style, 50, noise=b.noise_b)
    rows = {f"real renders, {STYLE}, through the teacher's VAE": b.real_row(f"real-{STYLE}", STYLE),
            "real renders, plain, through the teacher's VAE": b.real_row("real-plain", "plain"),
            "teacher 50 steps": b.teacher_row("teacher-50", (), 50),
            "teacher + style LoRA 50 steps": b.teacher_row("teacher-lora-50", style, 50),
            "teacher + style LoRA 4 steps": b.teacher_row("teacher-lora-4", style, 4)}
    seeds = [int(s) for s in args.seeds.split(",")]
    runs, comparisons, lab = {}, {}, {}
    second = args.second_lora
    if second is None and not args.no_lab:
        second = args.out / "second_lora"
        if not second.exists():
            from dmad.demo.make_lora import LoraTraining, main_make_lora

            log(f"making the lab's second user LoRA ({SECOND_STYLE}) in {second}")
            main_make_lora(out=second, teacher=None, training=LoraTraining(style=SECOND_STYLE))
    curves = {}
    for seed in seeds:
        runs[seed] = {}
        if not args.no_preset:
            pl = train(args.out, Method("personal_lightning", "Personal Lightning", PRESET), seed, b.config, log)
            runs[seed]["personal_lightning"] = pl
            pl_dir = Path(pl["run_dir"])
            rows[f"Personal Lightning student, seed {seed}"] = b.student_row(f"pl-student-s{seed}", pl_dir, style)
        for name, overrides in variants.items():
            run = train(args.out, Method(f"pl_{name}", f"Personal Lightning + {name}", PRESET, overrides),
                        seed, b.config, log)
            runs[seed][f"pl_{name}"] = run
            rows[f"Personal Lightning + {name} ({'; '.join(overrides)}), seed {seed}"] = b.student_row(
                f"pl-{name}-s{seed}", Path(run["run_dir"]), style)
        if args.curve:
            for key, run in runs[seed].items():
                curves[f"{key}, seed {seed}"] = learning_curve(b, Path(run["run_dir"]), style, f"{key}-s{seed}")
        if args.no_stacked:
            continue
        base = train(args.out, Method("base_lora", "base-distilled LoRA student", PRESET,
                                      ("identity.teacher_loras=[]",)), seed, b.config, log)
        runs[seed]["base_lora"] = base
        base_dir = Path(base["run_dir"])
        rows[f"base-distilled student, seed {seed}"] = b.student_row(f"base-student-s{seed}", base_dir, ())
        rows[f"base-distilled student + style LoRA stacked, seed {seed}"] = b.student_row(
            f"base-student-stacked-s{seed}", base_dir, style)
        stacked, own = rows[f"base-distilled student + style LoRA stacked, seed {seed}"], rows[f"Personal Lightning student, seed {seed}"]
        from dmad.demo.metrics import fd_difference_interval, feature_stats

        fd = fd_difference_interval(own["features"], stacked["features"], *feature_stats(reference["features"]),
                                    groups=b.groups)
        comparisons[seed] = {"style": paired(own, stacked, "style_hits", b.groups),
                             "adherence": paired(own, stacked, "right", b.groups),
                             "fd_ref": {"difference": float(fd["diff"]), "ci": [float(x) for x in fd["diff_ci"]]}}
        if args.no_lab or seed != seeds[0]:
            continue
        for s in (0.5, 1.2):  # the student LoRA's scale
            lab[f"student LoRA scale {s}"] = b.student_row(f"lab-student-scale-{s}-s{seed}", pl_dir, style, s)
        for s in (0.5, 1.5):  # the user LoRA's scale, the student as distilled
            lab[f"style LoRA scale {s}"] = b.student_row(f"lab-style-scale-{s}-s{seed}", pl_dir, ((b.style_lora, s),))
            lab[f"teacher + style LoRA scale {s}, 50 steps"] = b.teacher_row(f"lab-teacher-style-scale-{s}", ((b.style_lora, s),), 50)
        if second is not None:
            two = (*style, (str(second), 1.0))
            lab["+ a second user LoRA"] = b.student_row(f"lab-second-lora-s{seed}", pl_dir, two)
            lab["teacher + both LoRAs, 50 steps"] = b.teacher_row("lab-teacher-second-lora", two, 50)
    for r in (*rows.values(), *lab.values(), *(r for c in curves.values() for r in c.values())):
        b.fd_to(r, reference)
    summary = {}
    if len(seeds) > 1 and comparisons:
        for key in ("style", "adherence", "fd_ref"):
            diffs = [comparisons[s][key]["difference"] for s in seeds]
            summary[key] = {"mean": float(np.mean(diffs)), "sd": float(np.std(diffs, ddof=1)), "t_ci": t_interval(diffs)}
    hidden = ("style_hits", "right", "features")
    result = {"settings": {**b.settings, "training_seeds": seeds, "reference": "teacher + style LoRA, 50 steps, noise B"},
              "runs": runs,
              "rows": {k: {kk: vv for kk, vv in v.items() if kk not in hidden} for k, v in rows.items()},
              "comparisons": comparisons, "over_seeds": summary,
              "curves": {k: {it: {kk: vv for kk, vv in r.items() if kk not in hidden} for it, r in c.items()}
                         for k, c in curves.items()},
              "lab": {k: {kk: vv for kk, vv in v.items() if kk not in hidden} for k, v in lab.items()},
              "wall_s": round(time.perf_counter() - t0, 1)}
    if args.json:
        from dmad.contract.runs import atomic_write_json

        atomic_write_json(args.json, result)
    print(markdown(result))
    return 0


def markdown(result: dict) -> str:
    def pct(v, ci=None):
        return f"{v:.1%}" + (f" [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else "")

    out = [f"| row | {STYLE} [95%] | {SECOND_STYLE} | caption adherence [95%] | FD to teacher + LoRA [95%] |",
           "|---|---:|---:|---:|---:|"]
    for name, r in {**result["rows"], **{f"lab: {k}": v for k, v in result["lab"].items()}}.items():
        out.append(f"| {name} | {pct(r['style'], r['style_ci'])} | {r['second_style']:.1%} | "
                   f"{pct(r['adherence'], r['adherence_ci'])} | {r['fd_ref']:.2f} [{r['fd_ref_ci'][0]:.2f}, "
                   f"{r['fd_ref_ci'][1]:.2f}] |")
    out.append("")
    for seed, c in result["comparisons"].items():
        out.append(f"Seed {seed}, Personal Lightning minus stacked: style {c['style']['difference']:+.1%} "
                   f"[{c['style']['ci'][0]:+.1%}, {c['style']['ci'][1]:+.1%}], adherence "
                   f"{c['adherence']['difference']:+.1%} [{c['adherence']['ci'][0]:+.1%}, {c['adherence']['ci'][1]:+.1%}], "
                   f"FD to teacher + LoRA {c['fd_ref']['difference']:+.2f} [{c['fd_ref']['ci'][0]:+.2f}, "
                   f"{c['fd_ref']['ci'][1]:+.2f}]")
    for name, curve in result.get("curves", {}).items():
        out.append(f"Learning curve, {name}: " + "; ".join(
            f"iteration {it}: {STYLE} {r['style']:.1%}, adherence {r['adherence']:.1%}, FD {r['fd_ref']:.2f}"
            for it, r in curve.items()))
    for key, v in result["over_seeds"].items():
        ci = v["t_ci"]
        out.append(f"Over seeds, {key}: mean {v['mean']:+.4f}, SD {v['sd']:.4f}, 95% t interval "
                   f"[{ci[0]:+.4f}, {ci[1]:+.4f}]")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
