"""The Memory estimate of a CPU run (issue 42 polish): the engine sizes the device a run started here
trains on (inputs.device); for a CPU run neither the table nor the words around it speak of a CUDA
context, and a GPU's NVML total is not set against it; a GPU run keeps both. The engine is a stand-in
printing what `dmad ledger --json` prints (its margin line from dmad.memory.ledger.margin_line). No torch."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.widgets.ledger_view import LedgerView
from dmad.memory.ledger import margin_line

FIXTURE = Path(__file__).parent / "fixtures" / "probe" / "ledger.json"


def _view(qtbot, tmp_path: Path, device: str) -> LedgerView:
    doc = json.loads(FIXTURE.read_text())
    subtotal = sum(x["gib"] for x in doc["lines"])
    margin = margin_line(subtotal, device)
    doc["lines"].append({"name": margin.name, "gib": margin.gib, "assumption": margin.assumption, "scope": "gpu"})
    doc["total_gib"] = subtotal + margin.gib
    doc["inputs"]["device"] = device
    (tmp_path / "ledger.json").write_text(json.dumps(doc))
    script = tmp_path / "standin.py"
    script.write_text(f"import sys\nsys.stdout.write(open({str(tmp_path / 'ledger.json')!r}).read())\n")
    view = LedgerView(lambda target: target.write_text("{}") or target, [sys.executable, str(script)])
    qtbot.addWidget(view)
    view.set_device("NVIDIA GeForce RTX 4090", 23.99)
    with qtbot.waitSignal(view.ledger_shown, timeout=60_000):
        view.refresh()
    return view


def _table_text(view: LedgerView) -> str:
    t = view.table
    return "\n".join(t.item(r, c).text() for r in range(t.rowCount()) for c in range(3) if t.item(r, c))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_cpu_run_shows_no_cuda_context_and_a_gpu_run_keeps_it(qtbot, tmp_path, device):
    view = _view(qtbot, tmp_path, device)
    on_cpu = device == "cpu"
    assert ("CUDA context 0.5 GiB" in _table_text(view)) is not on_cpu
    assert ("also holds the CUDA context" in view.note.text()) is not on_cpu
    assert ("a CPU run" in view.status.text()) is on_cpu
    assert ("on NVIDIA GeForce RTX 4090" in view.total_text()) is not on_cpu
