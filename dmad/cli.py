"""The `dmad` command line (DESIGN.md, Command line). Users' scripts depend on this surface.

Exit codes: 0 success; 1 the run failed; 2 invalid input (config, data, arguments); 3 out of
memory; 130 interrupted. Every error is one line on stderr, never a traceback: tracebacks of
unexpected errors go to the run's logs/engine.log (or a temp file before a run folder exists).

Config errors are found before torch is imported, so `dmad train --config bad.json` answers in
a fraction of a second: dmad.train.loop and the model code are imported only after preflight.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional, Sequence

from dmad import __version__
from dmad.contract.exports import DTYPES, FORMATS
from dmad.errors import EXIT_OK, EXIT_RUN_FAILED, DmadError, UserInputError
from dmad.train.children import rank_dies_with_launcher
from dmad.train.launch import accelerate_command, launched, run_launched

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C

# OpenMP (libgomp, torch's CPU threads) spins a waiting thread 300,000 rounds before it sleeps. With
# another busy process on the same cores, spinning threads take the cores the working ones need;
# 10,000 rounds was faster both alone (37.5 vs 32.5 passes/s) and beside a second busy process
# (10.7 vs 7.9) in bench/contention.py. Set before torch is imported (libgomp reads it when it
# loads); a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins (PASSIVE: 19.4 beside a busy process,
# 23.3 alone). Child processes (accelerate's ranks) inherit it.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
# MKL (torch's CPU BLAS) picks kernels by the memory alignment of each call's tensors unless its
# conditional numerical reproducibility is on, so the same run can differ in the last bits from one
# process to the next: on an AMD EPYC, a shared-base run and a separate-copies run differed at
# iteration 1 by 1e-10 without it and were bit-identical with it (tests/engine/test_shared_base.py).
# AUTO keeps the fastest code path of this CPU and fixes only the alignment dependence (no
# measurable cost: 0.22-0.29 s per demo-teacher training step either way). A user's value wins.
os.environ.setdefault("MKL_CBWR", "AUTO")


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors become one line on stderr and exit 2 (via UserInputError)."""

    def error(self, message: str):  # type: ignore[override]
        sub = self.prog.partition(" ")[2]
        where = f"{sub}: " if sub else ""
        raise UserInputError(f"{where}{message} (see '{self.prog} --help')")


def _processes(value: str) -> int:
    """--processes N: a whole number from 1 to 4096 (argparse's one-line error otherwise)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if not 1 <= n <= 4096:
        raise argparse.ArgumentTypeError(f"must be from 1 to 4096, got {n}")
    return n


def _path(value: str) -> str:
    """argparse type of every path argument: a NUL byte or an over-long name is a usage error
    (exit 2, naming the argument) before any OS call could raise on it."""
    from dmad.contract.jsonfile import path_problem

    problem = path_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


@dataclass
class _Context:
    """What main() needs to know to place a crash log: the run folder, once preflight named it."""

    run_dir: Optional[Path] = None

    def set_run_dir(self, run_dir: Path) -> None:
        self.run_dir = run_dir


def build_parser() -> argparse.ArgumentParser:
    """The `dmad` parser: one function per command (COMMANDS), each adding its subparser."""
    # allow_abbrev=False: "--dry" working today would break users' scripts once another --dry* exists.
    parser = _Parser(prog="dmad", allow_abbrev=False,
                     description="DMAD Studio engine: distil a diffusion teacher into a 1-4 step student.")
    parser.add_argument("--version", action="version", version=f"dmad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def _add_train(sub) -> None:
    """`dmad train`."""
    train = sub.add_parser("train", allow_abbrev=False, help="train a student (or check a config with --dry-run)",
                           description="Train a student. Events go to stdout (one JSON object per line) and to "
                                       "<run>/events.jsonl; library output goes to stderr and <run>/logs/engine.log.")
    train.add_argument("--config", required=True, type=_path, metavar="FILE", help="run config (JSON)")
    train.add_argument("--run-dir", type=_path, metavar="DIR", help="run folder (default: identity.output_dir / identity.run_name, "
                                                        "or a dated name when run_name is empty)")
    train.add_argument("--resume", type=_path, metavar="latest|PATH",
                       help="continue from the run folder's latest checkpoint, or from a checkpoint folder "
                            "(overrides observation.resume_from_checkpoint)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field by its dotted path, e.g. resources.train_batch_size=2 "
                            "(values parse as JSON when they can); repeatable")
    train.add_argument("--num-processes", type=int, default=1, metavar="N",
                       help="processes in all (one per GPU; several machines: the total), started with "
                            "`accelerate launch` (resources.distributed: ddp or fsdp); default 1")
    train.add_argument("--num-machines", type=int, default=1, metavar="M", help="machines (default 1)")
    train.add_argument("--machine-rank", type=int, default=0, metavar="R", help="this machine's rank (0 .. M-1)")
    train.add_argument("--main-process-ip", metavar="IP", help="address of machine 0 (several machines)")
    train.add_argument("--main-process-port", type=int, metavar="PORT", help="port on machine 0 (several machines)")
    train.add_argument("--dry-run", action="store_true",
                       help="validate config, data, teacher and run folder; print the resolved config and the "
                            "memory estimate; do not train")
    train.set_defaults(handler=_cmd_train)


def _add_sample(sub) -> None:
    """`dmad sample`."""
    sample = sub.add_parser(
        "sample", allow_abbrev=False, help="render a checkpoint (or the teacher) again with the prompt set",
        description="Render a run's checkpoint with the student's own timesteps (from the checkpoint) or the teacher "
                    "with the prompt set's sampler, steps and CFG, into <out>/<iter_N|teacher>/<id>.png + meta.json. "
                    "An existing folder is never replaced: the images go to the first free <name>-r2, -r3, ... "
                    "The same checkpoint and prompt set give byte-identical PNGs on a CPU. stdout: one samples "
                    "event (JSON); stderr: where the images went and the time per image.")
    sample.add_argument("--run", required=True, type=_path, metavar="DIR", help="run folder")
    sample.add_argument("--checkpoint", default="latest", metavar="latest|teacher|N",
                        help="the latest checkpoint (default), the teacher, or checkpoints/iter_N")
    sample.add_argument("--prompt-set", type=_path, metavar="FILE", help="prompt set (default: the run's prompt_set.json)")
    sample.add_argument("--out", type=_path, metavar="DIR", help="output base folder (default: <run>/samples)")
    sample.add_argument("--sweep", nargs="+", metavar="KEY=V1,V2",
                        help="render one prompt over steps and/or cfg values (e.g. steps=1,2,4 cfg=1,3: rows, then "
                             "columns) into a labelled grid <out>/sweep_<iter_N|teacher>_<id>.png with a .json beside it")
    sample.add_argument("--prompt-id", metavar="ID", help="the prompt of a --sweep (default: the set's first)")
    sample.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where to render (default: cuda when available)")
    one = sample.add_argument_group("one prompt of your own (the app's Playground): the checkpoint's image and "
                                    "the teacher's from the same noise, into <run>/samples/oneoff/ with a .json each")
    one.add_argument("--prompt", metavar="TEXT", help="render this prompt instead of the prompt set")
    one.add_argument("--negative-prompt", metavar="TEXT", help="for CFG (the teacher's, and the student's with --cfg)")
    one.add_argument("--seed", type=int, metavar="N", help="noise seed (default: the prompt set's)")
    one.add_argument("--steps", type=int, metavar="N", help="the student's steps (default: as trained)")
    one.add_argument("--cfg", type=float, metavar="X", help="the student's CFG (default: none, as trained)")
    one.add_argument("--size", metavar="WxH", help="resolution (default: the prompt set's)")
    one.add_argument("--no-teacher", action="store_true", help="the checkpoint's image only")
    sample.set_defaults(handler=_cmd_sample)


def _add_demo(sub) -> None:
    """`dmad demo`."""
    demo = sub.add_parser("demo", allow_abbrev=False, help="the built-in demo: distil the shipped shapes teacher",
                          description="Distil the shipped shapes teacher with resources/configs/demo.json into a run "
                                      "folder, then render the demo prompt set with the teacher and the student.")
    demo.add_argument("--run-dir", type=_path, metavar="DIR", help="run folder (default: a new dated folder under runs/)")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a field of the demo config, as for train; repeatable")
    demo.set_defaults(handler=_cmd_demo)
    demo_sub = demo.add_subparsers(dest="demo_command", metavar="SUBCOMMAND")
    make = demo_sub.add_parser("make-teacher", allow_abbrev=False, help="train the demo teacher from scratch",
                               description="Train the demo teacher (VAE, then UNet + text encoder) on procedural "
                                           "shapes, seeded and deterministic on a CPU; writes a diffusers folder "
                                           "with training_config.json and training_log.jsonl beside the weights.")
    make.add_argument("--out", required=True, type=_path, metavar="DIR", help="new folder for the teacher (must not exist)")
    from dmad.demo.make_teacher import add_training_arguments
    add_training_arguments(make)
    make.set_defaults(handler=_cmd_make_teacher)
    lora = demo_sub.add_parser("make-lora", allow_abbrev=False, help="train the demo style LoRA for the demo teacher",
                               description="Train a style LoRA (shapes drawn as outlines) for the demo teacher, as a "
                                           "user brings one to distil with identity.teacher_loras; writes diffusers' "
                                           "pytorch_lora_weights.safetensors with training_config.json, "
                                           "training_log.jsonl and README.md beside it.")
    lora.add_argument("--out", required=True, type=_path, metavar="DIR", help="new folder for the LoRA (must not exist)")
    lora.add_argument("--teacher", type=_path, metavar="DIR", help="the teacher folder (default: the shipped demo teacher)")
    from dmad.demo.make_lora import add_training_arguments as add_lora_arguments
    add_lora_arguments(lora)
    lora.set_defaults(handler=_cmd_make_lora)
    data = demo_sub.add_parser("make-data", allow_abbrev=False, help="write the demo shapes dataset, in a style",
                               description="Write the shipped shapes dataset (512 images and their captions) to a new "
                                           "folder, every image drawn in --style: the real images of the demo style "
                                           "LoRA's look, for a Personal Lightning run's GAN (identity.train_data_dir).")
    data.add_argument("--out", required=True, type=_path, metavar="DIR", help="new folder for the dataset (must not exist)")
    from dmad.demo.shapes import STYLES
    data.add_argument("--style", default="plain", choices=STYLES,
                      help="how every image is drawn (default plain: the shipped dataset itself)")
    data.set_defaults(handler=_cmd_make_data)


def _add_bench(sub) -> None:
    """`dmad bench`."""
    from dmad.demo.bench_runs import METHODS, PEER

    bench = sub.add_parser("bench", allow_abbrev=False, help="benchmarks", description="Benchmarks.")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    distill = bench_sub.add_parser(
        "distill", allow_abbrev=False, help="teacher vs distilled student on the demo, side by side",
        description="On the held-out set (or the tuning set): sample the demo teacher (50 steps + CFG, and 1/2/4 "
                    "steps) on full and under-specified captions, distil the default demo config once per training "
                    "seed (and each other method), sample every student at 1/2/4 steps, and score all with the "
                    "shipped evaluator: FD, adherence, total-variation distance to the data's distribution, coverage. "
                    "Tables go to stdout, progress to stderr; --out keeps the rows and runs, and the same command "
                    "goes on from there after an interruption.")
    distill.add_argument("--quick", action="store_true", help="fewer images and a 60-iteration distillation (minutes)")
    distill.add_argument("--json", type=_path, metavar="OUT", help="also write the results as JSON")
    distill.add_argument("--out", type=_path, metavar="DIR", help="keep the distillation run here (default: a temp folder)")
    distill.add_argument("--config", type=_path, metavar="FILE", help="distillation config (default: resources/configs/demo.json)")
    distill.add_argument("--methods", default="dmad", metavar="LIST",
                         help=f"dmad plus any of {PEER} (the peer: {METHODS[PEER].name} on DMAD's wall clock and at "
                              "equal training compute), gan_only and dm_only (DMAD's parts alone), comma-separated")
    distill.add_argument("--peer-config", type=_path, metavar="FILE",
                         help=f"the peer's config with {PEER} in --methods (default: resources/configs/"
                              f"{METHODS[PEER].config})")
    distill.add_argument("--set", dest="bench_set", default="heldout", choices=("heldout", "tuning"),
                         help="the held-out set (report numbers here) or the tuning set (choose defaults here)")
    distill.add_argument("--seeds", metavar="LIST",
                         help="training seeds, comma-separated (default 0,1,2; --quick: 0); each method trains once a seed")
    distill.add_argument("--teacher-cfg", metavar="SCALE",
                         help="the teacher rows' guidance scale (default: the distillations' prompt set's, 3 for "
                              "the demo; 1: none); the students keep their config's")
    distill.set_defaults(handler=_cmd_bench_distill)


def _add_check_data(sub) -> None:
    """`dmad check-data`."""
    check = sub.add_parser(
        "check-data", allow_abbrev=False, help="check a data folder or dataset list; report every problem",
        description="One pass over a folder of captioned images or a dataset list JSON: reports every problem "
                    "with its path (docs/check-data.md), then usable images per dataset and bucket and caption "
                    "lengths. Exit 0 when clean, 1 when problems were found, 2 on a usage error.")
    check.add_argument("source", type=_path, metavar="DATASETS_JSON|FOLDER", help="a dataset list JSON or a folder of images")
    check.add_argument("--json", type=_path, metavar="REPORT", help="also write the report as JSON (written atomically)")
    check.add_argument("--min-size", type=int, metavar="N",
                       help="shorter side below N pixels is an error (default half of --resolution: 256 at "
                            "512; a dataset's minimum_image_size wins)")
    check.add_argument("--resolution", type=int, default=512, metavar="N",
                       help="bucket target: about N*N pixels (default 512; a dataset's resolution wins)")
    check.add_argument("--batch", type=int, metavar="N", help="effective batch size: full batches per bucket")
    check.add_argument("--workers", type=int, metavar="N", help="parallel readers (default: CPU count)")
    check.add_argument("--progress", action="store_true", help="print 'progress <done> <total>' lines to stderr")
    check.add_argument("--no-cache", action="store_true",
                       help="neither read nor write the fingerprint cache: read and decode every file "
                            "(default: unchanged files reuse their last results; docs/check-data.md)")
    check.add_argument("--fast", action="store_true",
                       help="header and file structure only, no pixel decoding: truncation and corruption found "
                            "from PNG chunk CRCs, JPEG markers, WebP/BMP sizes; skips the near-constant and "
                            "near-duplicate checks (docs/check-data.md)")
    check.set_defaults(handler=_cmd_check_data)


def _add_ledger(sub) -> None:
    """`dmad ledger`."""
    ledger = sub.add_parser(
        "ledger", allow_abbrev=False, help="estimate a config's memory per component, before any run",
        description="The memory ledger of a config: teacher, student + gradients + optimizer state, fake score + "
                    "GAN head, activations for the batch / resolution / precision / checkpointing in use, VAE and "
                    "text encoder, and a margin; each line with its assumption. Framework scope (what torch "
                    "allocates on one device), an estimate: `dmad probe` measures. Reads the teacher's configs "
                    "only (no weights).")
    ledger.add_argument("--config", required=True, type=_path, metavar="FILE", help="run config (JSON)")
    ledger.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field by its dotted path, as for train; repeatable")
    ledger.add_argument("--processes", type=_processes, default=1, metavar="N",
                        help="one GPU of N processes (train --num-processes x --num-machines): with N > 1 the "
                             "ledger of the config's resources.distributed, then ddp and fsdp side by side")
    ledger.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ledger.set_defaults(handler=_cmd_ledger)


def _add_probe(sub) -> None:
    """`dmad probe`."""
    probe = sub.add_parser(
        "probe", allow_abbrev=False, help="measure memory and step time over batch sizes and resolutions",
        description="Measure, each in a process of its own: an inference-only baseline, then every (batch, "
                    "resolution) pair trained for warmup + steps iterations. Records framework, device and process "
                    "peaks (separate scopes), step time split into data and compute, and the phase of any "
                    "out-of-memory; writes probe.json, probe.csv and probe.md (a trade-off table and a "
                    "recommendation) to --out. docs/memory.md documents the columns.")
    probe.add_argument("--config", required=True, type=_path, metavar="FILE", help="run config (JSON)")
    probe.add_argument("--batch", metavar="N,N,...", help="train_batch_size values (default: the config's)")
    probe.add_argument("--resolution", metavar="N,N,...", help="resolutions, multiples of 8 (default: the config's)")
    probe.add_argument("--steps", type=int, default=10, metavar="N", help="measured iterations per point (default 10)")
    probe.add_argument("--warmup", type=int, default=3, metavar="N", help="iterations before measuring (default 3)")
    probe.add_argument("--out", type=_path, metavar="DIR", help="new folder for the results (default: probes/<config>_<time>)")
    probe.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field by its dotted path, as for train; repeatable")
    probe.add_argument("--progress", action="store_true", help="print 'progress <done> <total>' lines to stderr")
    probe.set_defaults(handler=_cmd_probe)


def _add_probe_point(sub) -> None:
    """`dmad probe-point`."""
    point = sub.add_parser("probe-point", allow_abbrev=False,
                           description="One point of dmad probe (internal: dmad probe starts it).")
    sub._choices_actions = [a for a in sub._choices_actions if a.dest != "probe-point"]  # not in --help
    point.add_argument("--config", required=True, type=_path)
    point.add_argument("--kind", required=True, choices=("baseline", "train"))
    point.add_argument("--batch", type=int, required=True)
    point.add_argument("--resolution", type=int, required=True)
    point.add_argument("--steps", type=int, required=True)
    point.add_argument("--warmup", type=int, required=True)
    point.add_argument("--run-dir", required=True, type=_path)
    point.add_argument("--result", required=True, type=_path)
    point.add_argument("--set", action="append", default=[])
    point.set_defaults(handler=_cmd_probe_point)


def _add_cache(sub) -> None:
    """`dmad cache`."""
    cache = sub.add_parser(
        "cache", allow_abbrev=False, help="fill the latent and text-embedding cache of a config ahead of training",
        description="Encode every usable image (VAE, vae_batch_size per call) and caption (text encoder) of the "
                    "config's datasets into the cache that training with resources.cache_latents reads. Entries are "
                    "keyed by file, size, mtime, bucket and model identity: what is cached is never encoded again, "
                    "and a changed file, resolution or model gets new entries.")
    cache.add_argument("--config", required=True, type=_path, metavar="FILE", help="run config (JSON)")
    cache.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field by its dotted path, as for train; repeatable")
    cache.add_argument("--progress", action="store_true", help="print 'progress <done> <total>' lines to stderr")
    cache.set_defaults(handler=_cmd_cache)


def _add_export(sub) -> None:
    """`dmad export`."""
    export = sub.add_parser(
        "export", allow_abbrev=False, help="export a checkpoint's student for diffusers",
        description="Export a checkpoint's student: 'diffusers' writes a complete pipeline folder of the teacher's "
                    "family whose scheduler reproduces the student's timesteps; 'lora' (LoRA students) writes a "
                    "LoRA that diffusers' load_lora_weights puts on the teacher; 'lora-single-file' (LoRA students) "
                    "writes it as one .safetensors in the layout ComfyUI, Forge and A1111 load (kohya names for "
                    "SD 1.x/2.x/XL, diffusers names for SD3 and Flux), with metadata; 'single-file' (any student) writes "
                    "the student's UNet or transformer as one .safetensors (diffusers names, which ComfyUI's Load "
                    "Diffusion Model node reads), with metadata. Prints the output folder.")
    export.add_argument("--run", required=True, type=_path, metavar="DIR", help="run folder")
    export.add_argument("--checkpoint", default="latest", metavar="latest|N", help="checkpoint (default: latest)")
    export.add_argument("--format", required=True, choices=FORMATS,
                        help="what to write")
    export.add_argument("--dtype", default="fp32", choices=DTYPES,
                        help="the saved weights' precision (default fp32: as trained, the run's samples exactly)")
    export.add_argument("--out", type=_path, metavar="DIR", help="new output folder (default: <run>/export/iter_<N>-<format>)")
    export.add_argument("--merge-user-loras", action="store_true",
                        help="lora-single-file of a run whose teacher had identity.teacher_loras: one file that holds "
                             "the user's LoRAs at their scales and the student (exact: their ranks add up), for tools "
                             "that load one LoRA at a time")
    export.set_defaults(handler=_cmd_export)


COMMANDS = (_add_train, _add_sample, _add_demo, _add_bench, _add_check_data, _add_ledger, _add_probe, _add_probe_point, _add_cache, _add_export)


def _cmd_check_data(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.data.check_command import main_check_data  # PIL and numpy only when this command runs

    return main_check_data(source=args.source, json_report=args.json, min_size=args.min_size,
                           resolution=args.resolution, batch=args.batch, workers=args.workers,
                           progress=args.progress, cache=not args.no_cache, fast=args.fast)


def _cmd_probe(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.train.probe import main_probe

    return main_probe(config=args.config, batch=args.batch, resolution=args.resolution, steps=args.steps,
                      warmup=args.warmup, out=args.out, overrides=args.set, progress=args.progress)


def _cmd_probe_point(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.train.probe_point import main_probe_point

    return main_probe_point(config=args.config, kind=args.kind, batch=args.batch, resolution=args.resolution,
                            steps=args.steps, warmup=args.warmup, run_dir=args.run_dir, result_path=args.result,
                            overrides=args.set)


def _cmd_ledger(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.contract.config import load_config
    from dmad.memory.ledger import config_ledger, format_ledger, ledger_json

    cfg = load_config(args.config, args.set)
    lines = config_ledger(cfg, processes=args.processes)
    compare = _both_ways(cfg, args.processes)
    if args.json:
        print(json.dumps(ledger_json(cfg, lines, args.processes, compare)))
        return EXIT_OK
    print(format_ledger(lines))
    if compare:
        from dmad.memory.ledger import format_comparison

        print()
        print(format_comparison(compare, args.processes))
    return EXIT_OK


def _both_ways(cfg, processes: int, info=None) -> Optional[dict]:
    """ddp's and fsdp's ledgers at `processes` (> 1) for the side-by-side table; None for one process
    or a method fsdp does not train."""
    from dmad.memory.ledger import config_ledger

    if processes < 2 or cfg.distillation.method != "dmad":
        return None
    return {m: config_ledger(cfg, info, processes=processes, distributed=m) for m in ("ddp", "fsdp")}


def _cmd_cache(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.data.cache_command import main_cache

    return main_cache(config=args.config, overrides=args.set, progress=args.progress)


def _cmd_export(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.sample.export import main as export_main  # torch is imported only once the request is known good

    ctx.run_dir = Path(args.run).expanduser().resolve()  # a crash log goes to <run>/logs/engine.log
    return export_main(args.run, args.checkpoint, args.format, args.out, args.dtype, args.merge_user_loras)


def _cmd_sample(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.sample.command import main_sample

    ctx.run_dir = Path(args.run).expanduser().resolve()  # a crash log goes to <run>/logs/engine.log
    one_off = None
    given = [f"--{k.replace('_', '-')}" for k in ("negative_prompt", "seed", "steps", "cfg", "size", "no_teacher")
             if getattr(args, k) not in (None, False)]
    if args.prompt is not None:
        from dmad.sample.one_off import OneOff, parse_size

        one_off = OneOff(prompt=args.prompt, negative_prompt=args.negative_prompt, seed=args.seed, steps=args.steps,
                         cfg=args.cfg, size=parse_size(args.size) if args.size else None, teacher=not args.no_teacher)
    elif given:
        raise UserInputError(f"{given[0]} is for --prompt (a one-off request)")
    return main_sample(run=args.run, checkpoint=args.checkpoint, prompt_set=args.prompt_set, out=args.out,
                       sweep=args.sweep, prompt_id=args.prompt_id, device=args.device, one_off=one_off)


def _cmd_demo(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.demo.run import run_demo

    return run_demo(run_dir=args.run_dir, overrides=args.set, on_run_dir=ctx.set_run_dir)


def _cmd_make_teacher(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.demo.make_teacher import TeacherTraining, main_make_teacher

    training = TeacherTraining(**{f.name: getattr(args, f.name) for f in fields(TeacherTraining)})
    return main_make_teacher(out=args.out, training=training)


def _cmd_make_lora(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.demo.make_lora import LoraTraining, main_make_lora

    training = LoraTraining(**{f.name: getattr(args, f.name) for f in fields(LoraTraining)})
    return main_make_lora(out=args.out, teacher=args.teacher, training=training)


def _cmd_make_data(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.demo.run import main_make_data

    return main_make_data(out=args.out, style=args.style)


def _cmd_bench_distill(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.demo.bench import main_distill

    return main_distill(quick=args.quick, json_out=args.json, out_dir=args.out, config=args.config,
                        methods=args.methods, peer_config=args.peer_config, set_name=args.bench_set, seeds=args.seeds,
                        teacher_cfg=args.teacher_cfg)


def _cmd_train(args: argparse.Namespace, ctx: _Context) -> int:
    from dmad.contract.config import load_config
    from dmad.train.preflight import preflight

    if launched():  # a rank of a multi-process run: it never outlives its launcher
        rank_dies_with_launcher()
    cfg = load_config(args.config, args.set)
    resume = args.resume if args.resume is not None else cfg.observation.resume_from_checkpoint
    if args.resume is not None:
        if args.resume != "latest":
            resume = str(Path(args.resume).expanduser().resolve())  # relative to the shell, not the config
        cfg.observation.resume_from_checkpoint = resume
    run_dir = Path(args.run_dir).expanduser().resolve() if args.run_dir else None
    _check_processes(args)
    is_rank = launched()  # started by our own `accelerate launch`: the launcher checked the run folder
    pf = preflight(cfg, run_dir=run_dir, resume=resume, launched=is_rank)
    ctx.run_dir = pf.run_dir  # a crash log goes there once the folder exists
    if args.dry_run:
        print(dry_run_report(cfg, pf, args.num_processes))
        return EXIT_OK
    pf.require_teacher_weights()
    if not is_rank:  # the launcher checked: a rank starts once rank 0 may have written
        pf.require_space(cfg)
    if (args.num_processes > 1 or args.num_machines > 1) and not is_rank:
        return run_launched(accelerate_command(
            _rank_argv(args, pf), args.num_processes, args.num_machines, args.machine_rank, args.main_process_ip,
            args.main_process_port, cfg.resources.mixed_precision), pf.run_dir)
    from dmad.train.loop import run_training  # the training stack: only now that the inputs are known good

    r = pf.resume
    return run_training(cfg, run_dir=pf.run_dir, resume=pf.resume_arg, argv=_canonical_argv(args, pf),
                        restart=pf.restart, fallbacks=r.fallbacks if r else (), skipped=r.skipped if r else ())


MAX_PROCESSES_PER_MACHINE = 256  # one process per GPU (8-16 on the largest machines); gloo on CPU cores
MAX_MACHINES = 4096


def _check_processes(args: argparse.Namespace) -> None:
    if args.num_processes < 1 or args.num_machines < 1:
        raise UserInputError("--num-processes and --num-machines must be at least 1")
    if args.num_machines > MAX_MACHINES:
        raise UserInputError(f"--num-machines {args.num_machines}: at most {MAX_MACHINES}")
    if args.num_processes > MAX_PROCESSES_PER_MACHINE * args.num_machines:
        raise UserInputError(f"--num-processes {args.num_processes}: at most {MAX_PROCESSES_PER_MACHINE} a machine "
                             f"(one process per GPU), {MAX_PROCESSES_PER_MACHINE * args.num_machines} on "
                             f"{args.num_machines} machine(s)")
    if not 0 <= args.machine_rank < args.num_machines:
        raise UserInputError(f"--machine-rank {args.machine_rank}: must be 0 .. {args.num_machines - 1}")
    if args.num_processes % args.num_machines:
        raise UserInputError(f"--num-processes {args.num_processes} (all processes) is not a multiple of "
                             f"--num-machines {args.num_machines}")
    if args.num_machines > 1 and not args.main_process_ip:
        raise UserInputError("--num-machines > 1 needs --main-process-ip (the address of machine 0)")
    if args.main_process_port is not None and not 1 <= args.main_process_port <= 65535:
        raise UserInputError(f"--main-process-port {args.main_process_port}: must be a TCP port, 1 .. 65535")


def _rank_argv(args: argparse.Namespace, pf) -> list[str]:
    """What each rank runs after `dmad train`: the checked config, the fixed run folder and the
    resolved checkpoint (so no rank re-decides what 'latest' means)."""
    argv = ["--config", str(Path(args.config).resolve()), "--run-dir", str(pf.run_dir)]
    if pf.resume_arg or pf.restart:  # a restart: each rank finds no checkpoint, as the launcher did
        argv += ["--resume", pf.resume_arg or "latest"]
    for item in args.set:
        argv += ["--set", item]
    return argv


def _canonical_argv(args: argparse.Namespace, pf) -> list[str]:
    """The command for command.txt: absolute paths and an explicit run folder, so it works from any
    terminal folder (a fresh run's command re-run with --resume latest continues it)."""
    from dmad.contract.paths import engine_argv

    argv = engine_argv("train", "--config", str(Path(args.config).resolve()), "--run-dir", str(pf.run_dir))
    if args.resume is not None:
        argv += ["--resume", pf.resume_arg or args.resume]
    for item in args.set:
        argv += ["--set", item]
    return argv


def dry_run_report(cfg, pf, num_processes: int = 1) -> str:
    """The human report of --dry-run (stdout; real runs keep stdout for events)."""
    from dmad.memory.ledger import config_ledger, format_ledger

    ident = cfg.identity
    ledger = config_ledger(cfg, pf.teacher_info, processes=num_processes)
    compare = _both_ways(cfg, num_processes, pf.teacher_info)
    lines = [
        "Resolved config:",
        json.dumps(cfg.model_dump(mode="json"), indent=2),
        "",
        f"Run folder:  {pf.run_dir}" + (" (exists)" if pf.run_dir.exists() else " (will be created)"),
        f"Resume from: {pf.resume.checkpoint}" if pf.resume else "Resume from: (fresh start)",
        f"Teacher:     {ident.pretrained_model_name_or_path}" + ("" if pf.teacher_has_weights else
                                                                 " (weights missing: a real run needs them)"),
        *(f"  + LoRA   {x.path} at scale {x.scale:g} (fused into the teacher when it loads)"
          for x in ident.teacher_loras),
        f"Data:        {pf.data.images} images, {pf.data.captioned} with captions"
        + (f", {pf.data.usable} usable in {pf.data.buckets} bucket(s)" if pf.data.usable is not None else "")
        + f", in {pf.data.folder}",
        f"Batch:       {cfg.resources.train_batch_size} per process x {cfg.resources.gradient_accumulation_steps} "
        f"accumulation x {num_processes} process{'es' if num_processes != 1 else ''} = effective batch "
        f"{cfg.effective_batch(num_processes)} (learning rates are not rescaled)",
        f"Prompt set:  {pf.prompt_set.name}-{pf.prompt_set.version}",
        "",
        f"Memory ledger (estimate, framework peak per device; resources.distributed {cfg.resources.distributed}"
        + (f", {num_processes} processes" if num_processes > 1 else "") + "):",
        format_ledger(ledger),
    ]
    if compare:
        from dmad.memory.ledger import format_comparison

        lines += ["", format_comparison(compare, num_processes)]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no message)"


def _crash_log(exc: BaseException, run_dir: Optional[Path]) -> Path:
    """Append the traceback to <run>/logs/engine.log, or a temp file when there is no run folder
    or its log would be written through a link that leaves it."""
    from dmad.contract.runs import RunFolder

    text = f"\n[{time.strftime('%Y-%m-%d %H:%M:%S')}] dmad {' '.join(sys.argv[1:])}\n" + "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:  # is_dir itself raises for a name the OS refuses: the log then goes to a temp file
        log = run_dir / "logs" / "engine.log" if run_dir is not None and run_dir.is_dir() else None
    except (OSError, ValueError):
        log = None
    if log is not None and RunFolder(run_dir).inside(log):
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a", encoding="utf-8") as f:
                f.write(text)
            return log
        except OSError:
            pass
    with tempfile.NamedTemporaryFile("w", prefix="dmad-crash-", suffix=".log", delete=False, encoding="utf-8") as f:
        f.write(text)
        return Path(f.name)


def entry(argv: Optional[Sequence[str]] = None) -> int:
    """The `dmad` console script and `python -m dmad` (each rank of a multi-process run, the app's
    engine, the bundle's engine commands): main(), then the interpreter's last cyclic collection
    skipped. Python's shutdown collects every object once more, and with torch, diffusers and
    transformers loaded that walk took ~1 s of every engine exit (measured: 1.2 s from `finished` to
    the exit of `dmad train` against 0.2 s with this). gc.freeze() moves every live object where that
    collection does not look; their memory goes back with the process. Nothing is lost: every file
    is closed and renamed before main returns, and atexit handlers (logging's flush) still run. Not
    in main() itself, which tests and bench/ call in their own long-lived processes."""
    code = main(argv)
    gc.freeze()
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ctx = _Context()
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args, ctx))
    except SystemExit as e:  # --help / --version print and exit 0
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_RUN_FAILED)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `dmad train --dry-run | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_RUN_FAILED
    except DmadError as e:
        print(f"dmad: error: {_one_line(e)}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:  # a bug, not a user error: one line here, the traceback in a log
        log = _crash_log(e, ctx.run_dir)
        print(f"dmad: internal error: {type(e).__name__}: {_one_line(e)} (details in {log})",
              file=sys.stderr, flush=True)
        return EXIT_RUN_FAILED
