"""Several processes (GPUs, machines) through accelerate. Torch-free.

`dmad train --num-processes N [--num-machines M --machine-rank R --main-process-ip IP
--main-process-port P]` checks everything first in this process (preflight: config, data, run
folder, resume target), then starts `accelerate launch --multi_gpu` with the same train command
(run folder fixed, DMAD_LAUNCHED=1 so the ranks train instead of launching again) and waits.
accelerate's launcher (torch.distributed.run) starts one process per device; on a machine without
CUDA the ranks use the CPU with the gloo backend (how the tests run two processes).

Inside the run (dmad.train.loop), rank 0 writes everything: events (stdout and events.jsonl), metrics,
status, samples, checkpoints, logs/engine.log; rank k > 0 logs to logs/rank_<k>.log only, and
records an unexpected failure of its own in logs/rank_<k>.failed (one line). When a rank fails,
the launcher stops the others; this process then records the run as failed (status.json and an
error event naming the rank and its reason, unless rank 0 already recorded an end) and exits
with the run's code. Stop and Kill reach every process: `accelerate launch` stays in this process's
group (the app signals the engine's group), dies with this process, and the ranks die with it
(dmad.train.children). No learning rate is rescaled for the number of processes: the effective
batch (batch x accumulation x processes) is shown instead.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

LAUNCHED_ENV = "DMAD_LAUNCHED"


def launched() -> bool:
    """This process is a rank started by `accelerate launch` for dmad (not the user's command)."""
    return os.environ.get(LAUNCHED_ENV) == "1"


def world_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment, before torch loads; (0, 1) alone."""
    try:
        return int(os.environ.get("RANK", "0")), max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 0, 1


def accelerate_command(train_argv: Sequence[str], num_processes: int, num_machines: int = 1, machine_rank: int = 0,
                       main_process_ip: Optional[str] = None, main_process_port: Optional[int] = None,
                       mixed_precision: str = "no") -> list[str]:
    """`accelerate launch` for `dmad train <train_argv>` on every rank. In the PyInstaller bundle
    (one executable that answers both command lines, packaging/entry.py) the launcher is the
    bundle's `accelerate-launch` and each rank runs the executable itself (--no_python)."""
    frozen = getattr(sys, "frozen", False)
    launcher = [sys.executable, "accelerate-launch"] if frozen else [sys.executable, "-m", "dmad.train.accelerate_launch"]
    cmd = [*launcher, "--multi_gpu", "--num_processes", str(num_processes),
           "--num_machines", str(num_machines), "--machine_rank", str(machine_rank),
           "--mixed_precision", mixed_precision, "--dynamo_backend", "no"]
    if main_process_ip:
        cmd += ["--main_process_ip", main_process_ip]
    if main_process_port:
        cmd += ["--main_process_port", str(main_process_port)]
    rank = ["--no_python", sys.executable] if frozen else ["--module", "dmad"]
    return cmd + [*rank, "train", *train_argv]


def rank_failures(run_dir: Path) -> list[str]:
    """'rank k: <reason>' for every rank that recorded its own failure."""
    out = []
    for f in sorted((run_dir / "logs").glob("rank_*.failed")):
        try:
            out.append(f"{f.stem.replace('_', ' ')}: {f.read_text(encoding='utf-8').strip()}")
        except OSError:
            pass
    return out


def run_launched(cmd: list[str], run_dir: Path) -> int:
    """Run the launcher in this process's group (the app's Stop and Kill reach both), passing a
    SIGINT/SIGTERM on to it as SIGTERM, and record the failure of a rank that left the run without
    an end. The launcher dies with this process and the ranks with the launcher (dmad.train.children)."""
    from dmad.train.children import ENGINE_PID_ENV, die_with_parent_preexec, stops_passed_on

    import psutil

    # The ranks start seconds after this process: a Stop pressed meanwhile is theirs too (ControlReader).
    started = os.environ.get("DMAD_STARTED_AT") or str(psutil.Process().create_time())
    env = dict(os.environ, **{LAUNCHED_ENV: "1", "DMAD_STARTED_AT": started, ENGINE_PID_ENV: str(os.getpid())})
    proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent_preexec(os.getpid()))

    with stops_passed_on(proc):
        code = proc.wait()
    return launcher_result(code, run_dir)


def launcher_result(code: int, run_dir: Path) -> int:
    """The run's exit code once the launcher has ended with `code`; a failure rank 0 did not record
    (a rank that failed on its own, a launcher that died) is recorded here."""
    from dmad.errors import EXIT_OK, EXIT_RUN_FAILED
    from dmad.contract.events import CAUSE_RANK_FAILED, EventWriter
    from dmad.contract.runs import RunFolder

    if code == 0:
        return EXIT_OK
    folder = RunFolder(run_dir)
    status = folder.read_status() or {}
    failures = rank_failures(run_dir)
    if status.get("state") in ("finished", "stopped") and not failures:
        return EXIT_OK  # a SIGTERM made the launcher exit non-zero after the ranks stopped cleanly
    if status.get("state") == "failed" and not failures:
        return int(status.get("exit_code") or code)
    reason = ("; ".join(failures) if failures else
              f"the launcher exited with code {code} before rank 0 recorded an end (see {run_dir / 'logs'})")
    exit_code = int(status.get("exit_code") or EXIT_RUN_FAILED) if status.get("state") == "failed" else EXIT_RUN_FAILED
    if run_dir.is_dir():
        last = folder.latest_checkpoint()
        events = EventWriter(folder.events_jsonl)
        try:
            events.emit("error", status.get("iter"), reason=reason, exit_code=exit_code, cause=CAUSE_RANK_FAILED,
                        last_checkpoint=last[0] if last else None)
        finally:
            events.close()
        folder.write_status("failed", failure_reason=reason, exit_code=exit_code)
    print(f"dmad: error: {reason}", file=sys.stderr, flush=True)
    return exit_code
