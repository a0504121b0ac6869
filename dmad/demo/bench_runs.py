"""The distillations of `dmad bench distill`: which methods it trains (METHODS), each once per
training seed through the real command line (`dmad train` in a subprocess, timed wall to wall with
its CPU time), kept in <out>/runs so that an interrupted bench goes on; and the peer's plan (PEER), two budgets
in one run: DMAD's wall clock of the same seed and DMAD's counted training compute."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from dmad.errors import RunFailed, UserInputError


@dataclass(frozen=True)
class Method:
    key: str
    name: str                        # in row labels
    config: str                      # resources/configs/<file>
    overrides: tuple[str, ...] = ()


METHODS = {
    "dmad": Method("dmad", "DMAD", "demo.json"),
    "lcm": Method("lcm", "LCM", "demo_lcm.json"),
    "gan_only": Method("gan_only", "DMAD GAN alone", "demo.json", ("distillation.dm_weight=0",)),
    "dm_only": Method("dm_only", "DMAD DM alone", "demo.json",
                      ("distillation.generator_gan_weight=0", "distillation.critic_gan_weight=0")),
}
PEER = "lcm"                        # the peer DMAD is compared with at two budgets
PARTS = {"gan_only": "the GAN alone", "dm_only": "distribution matching alone"}  # DMAD's parts, alone


def train(out: Path, method: Method, seed: int, config: Path, log: Callable[[str], None], base: tuple[str, ...] = (),
          extra: tuple[str, ...] = (), control: Optional[Callable] = None, facts_extra: Optional[dict] = None) -> dict:
    """The distillation of `method` with training seed `seed` (overrides: `base`, the bench's, then
    the method's own, the seed and `extra`), once: its facts are kept in <out>/runs/<method>-seed<k>.json; a run
    without them (interrupted) starts again from scratch, so its wall clock is whole."""
    from dmad.contract.config import load_config
    from dmad.contract.runs import atomic_write_json
    from dmad.models.checkpoint import read_training_state

    name = f"{method.key}-seed{seed}"
    facts = out / "runs" / f"{name}.json"
    if facts.is_file():
        return json.loads(facts.read_text(encoding="utf-8"))
    run_dir = out / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = (*base, *method.overrides, f"resources.seed={seed}", *extra)
    run = run_distillation(run_dir, config, overrides, log, control=control)
    state = read_training_state(latest_checkpoint(run_dir))
    run.update(method=method.key, seed=seed, config=str(config), overrides=list(overrides), iterations=state.iter,
               network_passes=passes_total(state), student_timesteps=state.student_timesteps,
               effective_batch=load_config(Path(run_dir) / "config.json").effective_batch(), **(facts_extra or {}))
    atomic_write_json(facts, run)
    log(f"{method.name}, seed {seed}: {state.iter} iterations in {run['wall_time_s']:.0f} s, "
        f"{run['network_passes']} teacher-denoiser image-passes of training compute")
    return run


def latest_checkpoint(run_dir: Path) -> Path:
    from dmad.contract.runs import RunFolder

    latest = RunFolder(run_dir).latest_checkpoint()
    if latest is None:
        raise RunFailed(f"the distillation run {run_dir} left no checkpoint")
    return latest[1]


def passes_total(state) -> Optional[float]:
    """A checkpoint's training compute in teacher-denoiser image-passes (dmad.train.passes), or None
    for a checkpoint written before passes were counted."""
    counts = state.network_passes or {}
    if not counts:
        return None
    return round(sum((c["forward"] + 2 * c["backward"]) * c.get("weight", 1.0) for c in counts.values()), 1)


# ------------------------------------------------------------------------------- the peer's budgets

# bench.json keys of benches run before the peer's settings had their neutral names: read as today's
LEGACY_KEYS = {"lcm_step_cap": "peer_step_cap", "lcm_budget_s": "peer_budget_s", "lcm_config": "peer_config"}


def legacy_manifest(found: dict) -> dict:
    """An earlier bench's bench.json with its keys as today's (LEGACY_KEYS), so its folder goes on."""
    rename = lambda d: {LEGACY_KEYS.get(k, k): v for k, v in d.items()}  # noqa: E731
    out = rename(found)
    if isinstance(out.get("settings"), dict):
        out["settings"] = rename(out["settings"])
    return out


def peer_passes_per_iteration(effective_batch: int, guided_teacher: bool = True) -> int:
    """The peer's training compute per iteration in teacher-denoiser image-passes
    (dmad.train.passes), as its method unit states it per image, on the effective batch."""
    from dmad.methods import method_unit

    return effective_batch * method_unit(PEER).passes_per_image(guided_teacher)


@dataclass(frozen=True)
class PeerPlan:
    """The peer's run against DMAD's of the same seed: `equal` is the iteration where its counted
    passes equal DMAD's; it checkpoints every `every` iterations (a divisor of `equal`) and stops by
    two_budgets(budget_s, equal), or at its step cap."""

    config: Path
    equal: int
    every: int
    budget_s: float
    step_cap: int

    def overrides(self) -> tuple[str, ...]:
        return (f"optimization.max_train_steps={self.step_cap * self.equal}",
                f"observation.checkpointing_steps={self.every}", f"observation.validation_steps={self.every}")

    def facts(self, dmad: dict) -> dict:
        return {"equal_compute_iter": self.equal, "dmad_network_passes": dmad["network_passes"],
                "wall_clock_budget_s": self.budget_s}


def plan_peer(config: Path, overrides: tuple[str, ...], dmad: dict, guided_teacher: bool, step_cap: int,
              budget_s: Optional[float]) -> PeerPlan:
    """`config` (checked to be the peer's method) against DMAD's run `dmad`; budget_s None: DMAD's wall time."""
    from dmad.contract.config import load_config

    cfg = load_config(config, list(overrides))
    if cfg.distillation.method != PEER:
        raise UserInputError(f"--peer-config {config}: distillation.method is {cfg.distillation.method!r}, "
                             f"not {PEER!r}")
    equal = max(1, round(dmad["network_passes"] / peer_passes_per_iteration(cfg.effective_batch(), guided_teacher)))
    return PeerPlan(config, equal, equal // 2 if equal % 2 == 0 else equal,
                    dmad["wall_time_s"] if budget_s is None else budget_s, step_cap)


def peer_readings(run: dict, equal: int) -> tuple[list[tuple[str, int, Optional[Path]]], dict[int, Path]]:
    """Which of the peer's checkpoints the bench reads: ([(budget, iteration, checkpoint or None if it
    is missing)] for "same wall clock" (the first checkpoint at or after the iteration where DMAD's
    wall clock ran out; the last one if the run ended before) and "equal compute"), and the others
    by iteration (its learning curve)."""
    from dmad.contract.runs import RunFolder

    found = dict(RunFolder(Path(run["run_dir"])).list_checkpoints())
    at = wall_clock_iteration(run)
    wall_iter = min((it for it in found if it >= at), default=None) if at is not None else max(found)
    budgets = [(name, it, found.get(it)) for name, it in (("same wall clock", wall_iter), ("equal compute", equal))]
    return budgets, {it: c for it, c in found.items() if it not in (wall_iter, equal)}


def wall_clock_iteration(run: dict) -> Optional[int]:
    """The iteration the peer's run had reached when DMAD's wall clock ran out: that of the first control
    command the bench sent (two_budgets sends nothing before then), None when the run ended first.
    Read from the commands sent, not from `wall_clock_iter`: runs benched before 2026-12-06 kept
    the equal-compute iteration there once the stop was sent."""
    sent = run.get("control") or []
    return sent[0]["iter"] if sent else None


def two_budgets(wall_s: float, equal_iter: int) -> Callable[[float, int], list[str]]:
    """The control commands of the peer's run as time and iterations pass: at `wall_s`, a checkpoint
    (then stop, if the equal-compute iteration has been passed too); once both budgets are spent,
    stop. The run checkpoints at `equal_iter` on its own (checkpointing_steps divides it).
    `wall_iteration()`: the iteration at `wall_s` (None before it)."""
    state: dict = {"wall": None, "stopped": False}

    def commands(elapsed: float, iteration: int) -> list[str]:
        if state["stopped"]:
            return []
        if state["wall"] is None:
            if elapsed < wall_s:
                return []
            state["wall"] = iteration
            if iteration < equal_iter:
                return ["checkpoint_now"]
        elif iteration < equal_iter:
            return []
        state["stopped"] = True  # sent once
        return ["stop"]

    commands.wall_iteration = lambda: state["wall"]  # type: ignore[attr-defined]
    return commands


# ------------------------------------------------------------------------------- the subprocess

def run_distillation(run_dir: Path, config: Path, overrides: tuple[str, ...], log: Callable[[str], None],
                     control: Optional[Callable[[float, int], list[str]]] = None) -> dict:
    """`dmad train` in a subprocess, timed wall to wall (with its CPU time). `control(elapsed_s,
    iteration)` is asked twice a second which control commands to send (two_budgets)."""
    from dmad.contract.paths import engine_argv
    from dmad.contract.runlog import append_control
    from dmad.contract.runs import RunFolder

    args = ["train", "--config", str(config), "--run-dir", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    argv = engine_argv(*args)
    log(f"distilling: dmad {' '.join(args)}")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    stderr_path = run_dir.parent / f"{run_dir.name}.stderr.log"
    t0, c0 = time.perf_counter(), os.times()
    sent: list = []
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            time.sleep(0.5)
            if control is None or not (run_dir / "config.json").is_file():  # control.jsonl is read once the folder exists
                continue
            status = RunFolder(run_dir).read_status() or {}
            it = status.get("iter") if isinstance(status.get("iter"), int) else 0
            for cmd in control(time.perf_counter() - t0, it):
                append_control(run_dir, cmd)
                sent.append({"cmd": cmd, "at_s": round(time.perf_counter() - t0, 1), "iter": it})
    wall, c1 = time.perf_counter() - t0, os.times()
    if proc.returncode != 0:
        tail = stderr_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise RunFailed(f"the distillation exited with {proc.returncode}: {tail[0]} (log: {stderr_path})")
    wall_iter = control.wall_iteration() if control is not None and hasattr(control, "wall_iteration") else None
    return {"wall_time_s": round(wall, 1), "cpu_time_s": round(c1.children_user + c1.children_system
                                                                - c0.children_user - c0.children_system, 1),
            "run_dir": str(run_dir), "command": " ".join(argv), "control": sent, "wall_clock_iter": wall_iter}
