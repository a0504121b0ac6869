"""`dmad check-data SOURCE`: the command's entry point (dmad.cli calls main_check_data lazily, so
PIL and numpy load only when this command runs). It checks the arguments, runs the pass
(dmad.data.check.check_source), writes the JSON report when asked and prints the human summary
(dmad.data.check_report). Torch-free."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

from dmad.contract.diskspace import reporting_disk_full
from dmad.contract.runs import atomic_write_json
from dmad.data.check import check_source
from dmad.data.check_report import format_summary
from dmad.errors import UserInputError


class _Progress:
    """`progress <done> <total>` lines on stderr, at most ~10 a second (and always the last)."""

    def __init__(self):
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - self.last >= 0.1:
            self.last = now
            print(f"progress {done} {total}", file=sys.stderr, flush=True)


def main_check_data(*, source: str | Path, json_report: Optional[str | Path] = None, min_size: Optional[int] = None,
                    resolution: int = 512, batch: Optional[int] = None, workers: Optional[int] = None,
                    progress: bool = False, cache: bool = True, fast: bool = False) -> int:
    """Exit 0 when the source is clean, 1 when problems were found; UserInputError for bad
    arguments. `json_report`: also write the report there (--json). `min_size` None: half of
    `resolution`. `cache`: reuse and update the fingerprint cache (off: --no-cache). `fast`: header
    and file structure only, no pixel decoding (--fast)."""
    for name, value in (("min_size", min_size), ("resolution", resolution), ("batch", batch), ("workers", workers)):
        if value is not None and value < (0 if name == "min_size" else 1):
            raise UserInputError(f"check-data: --{name.replace('_', '-')} must be "
                                 f"{'>= 0' if name == 'min_size' else '>= 1'}, got {value}")
    # half the target resolution by default: a 64 px demo dataset is fine at --resolution 64, and a
    # 512 px SD set keeps the usual floor of 256
    min_size = min_size if min_size is not None else resolution // 2
    report = check_source(Path(source), min_size=min_size, resolution=resolution, batch=batch, workers=workers,
                          progress=_Progress() if progress else None, cache=cache, fast=fast)
    if json_report:
        _write_report(Path(json_report), report)
    print(format_summary(report), flush=True)
    return 0 if report["clean"] else 1


def _write_report(path: Path, report: dict) -> None:
    """--json, atomically; a full disk is its one line (exit 1: what, the bytes needed and free), any
    other failure a usage error naming the path."""
    try:
        with reporting_disk_full(f"--json {path.name}", path.parent,
                                 lambda: len(json.dumps(report, indent=2, ensure_ascii=False).encode("utf-8"))):
            atomic_write_json(path, report, durable=False)
    except OSError as e:
        raise UserInputError(f"check-data: cannot write --json {path}: {e.strerror or e}") from None
