"""The memory formats the engine writes and the app reads (docs/memory.md). Torch-free.

The ledger: a run's framework peak per device, estimated line by line before anything loads
(dmad.memory.ledger computes the lines; `dmad ledger --json` prints ledger_document, which the app
reads back with parse_ledger). A line's scope is "gpu" (part of the per-device peak) or "cpu" (host
RAM: the offloaded teacher and text encoders, shown but never added to the total); scopes are never
mixed in one figure. And the file `dmad probe` writes its measured points to.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional

PROBE_FILE = "probe.json"  # `dmad probe --out DIR` writes DIR/probe.json (dmad.train.probe)
SCOPES = ("gpu", "cpu")
LEDGER_SCOPE = "framework peak per device (estimate)"  # what the ledger's total measures


@dataclass(frozen=True)
class LedgerLine:
    name: str
    gib: float
    assumption: str  # how the figure was reached, shown next to it
    scope: str = "gpu"  # "gpu": part of the per-device peak; "cpu": host RAM (teacher_cpu_offload), not in the total


class Ledger(list):
    """The engine's estimate: its lines (a list of LedgerLine) and the teacher family they were
    computed for, so that dmad.memory.ledger.format_ledger and ledger_document can name it."""

    def __init__(self, lines: Any = (), family: Optional[str] = None):
        super().__init__(lines)
        self.family = family


def ledger_total(lines: Iterable[LedgerLine]) -> float:
    """The per-device peak estimate: the GPU lines only (a CPU RAM line is host memory)."""
    return sum(line.gib for line in lines if line.scope == "gpu")


def ledger_document(lines: list[LedgerLine], inputs: dict) -> dict:
    """`dmad ledger --json`: the lines (GiB to 4 decimals), total_gib of the GPU lines, the family
    when `lines` is a Ledger that names it, and the config values the estimate read (`inputs`)."""
    return {"scope": LEDGER_SCOPE,
            "family": getattr(lines, "family", None),
            "lines": [{"name": x.name, "gib": round(x.gib, 4), "assumption": x.assumption, "scope": x.scope}
                      for x in lines],
            "total_gib": round(ledger_total(lines), 4),
            "inputs": inputs}


@dataclass(frozen=True)
class LedgerReport:
    """A ledger as `dmad ledger --json` printed it (parse_ledger): the engine's numbers, read back."""
    scope: str
    lines: list[LedgerLine]
    total_gib: float     # the engine's GPU total: the "gpu" lines only
    inputs: dict
    family: Optional[str] = None  # the teacher family the engine sized (sd1, sd2, sdxl, sd3, flux); None: not said
    by_distributed: Optional[dict] = None  # {"ddp": GPU total GiB, "fsdp": ...} per GPU at inputs["processes"] > 1

    @property
    def gpu_lines(self) -> list[LedgerLine]:
        return [x for x in self.lines if x.scope == "gpu"]

    @property
    def cpu_lines(self) -> list[LedgerLine]:
        """Host-RAM lines (the offloaded teacher and text encoders): never part of total_gib."""
        return [x for x in self.lines if x.scope == "cpu"]

    @property
    def cpu_gib(self) -> float:
        return sum(x.gib for x in self.cpu_lines)


def _line(x: dict) -> LedgerLine:
    scope = str(x.get("scope") or "gpu")  # a ledger from before per-line scopes: every line is on the GPU
    if scope not in SCOPES:
        raise ValueError(f"line {x.get('name')!r} has scope {scope!r}; known: {', '.join(SCOPES)}")
    return LedgerLine(str(x["name"]), float(x["gib"]), str(x.get("assumption") or ""), scope)


def parse_ledger(text: str) -> LedgerReport:
    """`dmad ledger --json` stdout; ValueError (one line) when it is not a ledger. total_gib is the
    engine's GPU total (a line with scope "cpu" is host RAM and is not in it); family is the
    teacher family the engine sized, when it says."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ValueError(f"the ledger is not JSON ({e})") from None
    except RecursionError:
        raise ValueError("the ledger is not JSON (nested too deeply)") from None
    try:
        lines = [_line(x) for x in d["lines"]]
        family = d.get("family")
        modes = d.get("by_distributed")
        by = {str(m): float(doc["total_gib"]) for m, doc in modes.items()} if isinstance(modes, dict) else None
        return LedgerReport(str(d.get("scope") or LEDGER_SCOPE), lines, float(d["total_gib"]),
                            d.get("inputs") if isinstance(d.get("inputs"), dict) else {},
                            str(family) if isinstance(family, str) and family else None, by)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"malformed ledger: {type(e).__name__} {e}") from None
