"""What a rank other than 0 of a multi-process run (dmad.train.launch) writes: nothing in the run
folder but logs/rank_<k>.log (and logs/rank_<k>.failed if it fails on its own), so rank 0 is the
only writer of events, metrics, status, samples and checkpoints; and the few collectives that keep
the ranks in step (control commands, log means, non-finite losses, the backward-simulation step).
"""
from __future__ import annotations

from typing import Any, Optional

from dmad.contract.runs import RunFolder, atomic_write_text


class ReadOnlyFolder(RunFolder):
    """The run folder as a non-main rank sees it: readable (checkpoints, earlier events), never
    written."""

    is_writer = False

    def write_status(self, state: str, **fields: Any) -> dict:
        return {}

    def heartbeat(self) -> None:
        return None

    def note(self, **fields: Any) -> None:
        return None

    def write_json(self, name: str, obj: Any) -> None:
        return None

    def write_command(self, argv: list[str]) -> None:
        return None


class NullEvents:
    """The event writer of a non-main rank: rank 0 reports for the run."""

    def emit(self, kind: str, iter: Optional[int] = None, **data: Any) -> None:
        return None

    def emit_unless_ended(self, kind: str, iter: Optional[int] = None, **data: Any) -> None:
        return None

    def sync(self) -> None:
        return None

    def close(self) -> None:
        return None


class NullCsv:
    def __init__(self, columns: list[str]):
        self.columns = list(columns)

    def append(self, row: dict) -> None:
        return None

    def close(self) -> None:
        return None


class NullMonitor:
    """Rank 0's monitor keeps the heartbeat and gpu_mem.csv; other ranks have none."""
    device: Any = None

    def start(self) -> "NullMonitor":
        return self

    def stop(self) -> None:
        return None


def record_failure(folder: RunFolder, rank: int, reason: str) -> None:
    """logs/rank_<k>.failed: this rank's own failure, one line, for the launcher's report."""
    try:
        folder.logs_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder.logs_dir / f"rank_{rank}.failed", " ".join(reason.split())[:500] + "\n")
    except OSError:
        pass


def broadcast(accelerator: Any, value: Any) -> Any:
    """Rank 0's `value` on every rank (one small pickled object)."""
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box, from_process=0)
    return box[0]


def mean_logs(accelerator: Any, sums: dict[str, float], counts: dict[str, int]) -> tuple[dict, dict]:
    """Window sums and counts added over the ranks (same keys on every rank: the iterations that
    log are the same everywhere), so rank 0's row is the mean over all processes' samples."""
    import torch

    keys = sorted(sums)
    t = torch.tensor([sums[k] for k in keys] + [float(counts[k]) for k in keys], dtype=torch.float64,
                     device=accelerator.device)
    t = accelerator.reduce(t, reduction="sum")
    n = len(keys)
    return ({k: float(t[i]) for i, k in enumerate(keys)}, {k: int(round(float(t[n + i]))) for i, k in enumerate(keys)})


def any_rank(accelerator: Any, flag: bool) -> bool:
    """True on every rank when it is true on any."""
    import torch

    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(t, reduction="sum").item() > 0)
