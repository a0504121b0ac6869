"""The Training panel's row of run controls: Start, Continue, Pause, Resume, Stop, Sample now,
Sample prompt..., Checkpoint now, the process count, DDP or FSDP (the config's resources.distributed, with
the memory estimate per GPU of each) and the machines (the state line is the first item
of the numbers row below: app/widgets/run_numbers.py, where a long line has room). Three groups
(the run's lifecycle, its samples and checkpoints, how it launches) in a flow layout: one line on a
wide window, two on a 1024 px one.

Thin: it builds the row and shows what it is told. The panel decides what is enabled (it knows the
run's state and its engine) and connects each button; `machines_requested` asks the panel for the
machines dialog (a dialog sits above widgets in the app's layers).
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QSpinBox, QWidget

from app.engine.process import LaunchMachines
from app.widgets.flow_layout import FlowLayout
from app.widgets.wheel_guard import guard_wheel

SAMPLE_KEYS = ("sample", "sample_prompt", "checkpoint")
BUTTONS = (("start", "Start"), ("continue", "Continue"), ("pause", "Pause"), ("resume", "Resume"), ("stop", "Stop"),
           ("sample", "Sample now"), ("sample_prompt", "Sample prompt…"), ("checkpoint", "Checkpoint now"))


LONGEST_CONTINUE = "Continue from iteration 000000"


def reserve_width(button: QPushButton, longest: str = LONGEST_CONTINUE) -> None:
    """Keep a button whose text changes ("Start again", "Continue from iteration 1200") as wide as its
    longest text, so the buttons after it stay where the mouse expects them."""
    text = button.text()
    button.setText(longest)
    button.setMinimumWidth(button.sizeHint().width())
    button.setText(text)


SHARDING_TIP = ("How several processes split the work (the config's resources.distributed; changing it here edits "
                "the config). DDP: every GPU holds every network whole and gradients are averaged: fastest while "
                "the model fits. FSDP: the full student, the full fake score and its GAN head (and, with "
                "fsdp_shard_teacher, the teacher) are sharded over the processes: weights, gradients and optimizer "
                "states divided by their number; for full networks that do not fit one GPU. LoRA networks stay "
                "replicated either way. The memory estimate per GPU for each is beside it (Config > Memory "
                "estimate).")


def _group(flow: FlowLayout) -> QHBoxLayout:
    """A row of controls that stays together on one line of `flow`."""
    box = QWidget()
    row = QHBoxLayout(box)
    row.setContentsMargins(0, 0, 0, 0)
    flow.addWidget(box)
    return row


class RunControls(QWidget):
    machines_requested = Signal()
    distributed_chosen = Signal(str)  # "ddp" | "fsdp": the user picked it (the config follows)

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        flow = FlowLayout(self, spacing=12)  # three groups; a narrow window (1024 px) puts them on two lines
        lifecycle, samples, launch = (_group(flow) for _ in range(3))
        self.buttons = {key: QPushButton(text) for key, text in BUTTONS}
        for key, button in self.buttons.items():
            (samples if key in SAMPLE_KEYS else lifecycle).addWidget(button)
        self.buttons["stop"].setToolTip("Stop at the next iteration boundary and save a checkpoint")
        self.buttons["sample"].setToolTip("Render the run's prompt set with the current student now")
        self.buttons["sample_prompt"].setToolTip("Render one prompt of your own (and a seed) with the current "
                                                 "student; the image opens when it is ready")
        reserve_width(self.buttons["continue"])
        row = launch
        row.addWidget(QLabel("Processes"))
        self.processes = QSpinBox(minimum=1, maximum=64, value=1)
        guard_wheel(self.processes)  # wheel only when it has focus
        self.processes.setToolTip("Processes for Start and Continue, one per GPU: more than 1 runs `accelerate "
                                  "launch` (DDP). The effective batch is batch x accumulation x processes; learning "
                                  "rates are not rescaled. Over several machines this is the total (Machines...).")
        row.addWidget(self.processes)
        self.sharding = QComboBox()
        self.sharding.addItem("DDP", "ddp")
        self.sharding.addItem("FSDP", "fsdp")
        guard_wheel(self.sharding)
        self.sharding.setToolTip(SHARDING_TIP)
        self.sharding.currentIndexChanged.connect(
            lambda _i: None if self._showing else self.distributed_chosen.emit(self.sharding.currentData()))
        self._showing = False
        row.addWidget(self.sharding)
        self.machines = LaunchMachines()  # this machine alone, until the Machines dialog says otherwise
        self.machines_button = QPushButton("Machines: 1")
        self.machines_button.setToolTip("Run over several machines (accelerate: --num-machines, --machine-rank, "
                                        "--main-process-ip, --main-process-port)")
        self.machines_button.clicked.connect(lambda: self.machines_requested.emit())
        row.addWidget(self.machines_button)
        self.flow = flow

    def show_distributed(self, value: str) -> None:
        """The config's resources.distributed, shown without sending it back."""
        i = self.sharding.findData(value if value in ("ddp", "fsdp") else "ddp")
        self._showing = True
        try:
            self.sharding.setCurrentIndex(i)
        finally:
            self._showing = False

    def show_per_gpu(self, by_distributed: Optional[dict], processes: int) -> None:
        """The memory estimate per GPU for each setting in its item ("DDP · 115 GiB/GPU"), when the
        ledger knows it for `processes` > 1; the bare names otherwise."""
        for i in range(self.sharding.count()):
            mode = self.sharding.itemData(i)
            gib = (by_distributed or {}).get(mode) if processes > 1 else None
            shown = "" if gib is None else f" · {gib:.1f} GiB/GPU" if gib < 10 else f" · {gib:.0f} GiB/GPU"
            self.sharding.setItemText(i, mode.upper() + shown)

    def show_machines(self, machines: LaunchMachines) -> None:
        """The machines a Start or Continue launches on (`machines`), shown on their button."""
        self.machines = machines
        self.machines_button.setText(f"Machines: {machines.count}"
                                     + (f" (rank {machines.rank})" if machines.count > 1 else ""))

    def show_continue(self, enabled: bool, text: str, tooltip: str) -> None:
        button = self.buttons["continue"]
        button.setText(text)
        button.setToolTip(tooltip)
        button.setEnabled(enabled)
