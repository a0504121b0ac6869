"""The second distillation method (distillation.method lcm) in the app: the Config form's method combo
and the settings it greys out, presets that say their method (the LCM CPU demo among them), an LCM
run's metrics in the Training plots (loss_lcm; no empty critic plots), and the method in the runs
table, the config diff and the samples' provenance. No torch, no engine process."""
from __future__ import annotations

import copy
import csv
import json
import os
import socket
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox

from app.dialogs.config_diff import ConfigDiffDialog
from app.models import methods
from app.models.config_diff import diff_configs
from app.models.presets import presets
from app.models.sample_index import provenance, scan_samples
from app.models.series import SeriesStore
from app.panels.config import ConfigPanel
from app.panels.training import TrainingPanel
from app.widgets.plot_board import PlotBoard
from dmad.contract.config import load_config
from dmad.contract.events import make_event
from dmad.contract.methods import DEFAULT_METHOD, METHODS, canonical_method, unused_settings
from dmad.contract.runs import RunFolder, atomic_write_json
from dmad.errors import UserInputError
from tests.app.test_plots import board  # noqa: F401 - the shown PlotBoard fixture
from tests.app.test_runs_panel import _config, cell, open_panel
from tests.app.test_runs_panel import write_run as write_listed_run

WAIT_MS = 30_000  # generous: the machine is shared; nothing here is a timing test
METHOD = ("distillation", "method")
# what LCM does not read, and what only LCM reads (the brief the engine change came with)
# (in the form's order; share_frozen_base: LCM's LoRA student is its own copy)
UNUSED_WITH_LCM = [("identity", "fake_score"), ("resources", "share_frozen_base"), ("optimization", "critic_lr"),
                   ("distillation", "critic_updates_per_generator_update"), ("distillation", "dm_weight"),
                   ("distillation", "generator_gan_weight"), ("distillation", "critic_gan_weight"), ("distillation", "gan_head_placement"),
                   ("distillation", "min_timestep"), ("distillation", "max_timestep"),
                   ("distillation", "real_guidance_max_timestep"), ("distillation", "regression_weight"), ("distillation", "regression_images"),
                   ("distillation", "regression_teacher_steps")]
LCM_ONLY = [("distillation", "lcm_ddim_timesteps"), ("distillation", "lcm_loss_type"),
            ("distillation", "lcm_huber_c"), ("distillation", "lcm_target_ema_decay")]
LCM_TIP = ("consistency loss (lcm_loss_type: L2 or pseudo-Huber) between the student at t_n+k and the EMA target "
           "at t_n after one guided DDIM step of the teacher")
TIP = Qt.ItemDataRole.ToolTipRole
DMAD_COLUMNS = ("loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_d_gan", "loss_c", "dm_grad_norm",
                "d_real_acc", "d_fake_acc", "grad_norm_c")


@pytest.fixture
def panel(qtbot, tmp_path) -> ConfigPanel:
    p = ConfigPanel(unsaved_dir=tmp_path / "unsaved")  # opens on the CPU demo preset (dmad)
    qtbot.addWidget(p)
    return p


def greyed(panel: ConfigPanel) -> list[tuple]:
    return [k for k, row in panel.form.rows.items() if not row.editor.isEnabled() or not row.label.isEnabled()]


def preset_named(start: str):
    return next(p for p in presets() if p.name.startswith(start))


# ------------------------------------------------------------ the Config form

def test_the_method_is_a_combo_with_readable_names(panel):
    combo = panel.form.rows[METHOD].editor.control()
    assert isinstance(combo, QComboBox)
    assert [combo.itemText(i) for i in range(combo.count())] == ["DMAD (dmad)", "LCM (lcm)"]
    assert [combo.itemData(i) for i in range(combo.count())] == ["dmad", "lcm"]
    assert combo.currentText() == "DMAD (dmad)"
    assert greyed(panel) == LCM_ONLY  # the demo is DMAD: only the lcm_* settings are idle


def test_choosing_lcm_greys_out_the_critic_settings_and_keeps_their_values(panel):
    combo = panel.form.rows[METHOD].editor.control()
    critic_lr = panel.form.rows[("optimization", "critic_lr")].editor.control()
    assert critic_lr.text() == "0.0001"
    combo.setCurrentIndex(combo.findData("lcm"))  # what a click on "LCM (lcm)" does
    assert panel.config()["distillation"]["method"] == "lcm" and panel.is_valid(), panel.validity_message()
    assert greyed(panel) == UNUSED_WITH_LCM
    for key in UNUSED_WITH_LCM:
        row = panel.form.rows[key]
        assert "unused with method lcm" in row.editor.control().toolTip()
        assert "unused with method lcm" in row.label.toolTip()
    assert "unused" not in panel.form.rows[("distillation", "lcm_huber_c")].editor.toolTip()
    assert critic_lr.text() == "0.0001" and panel.config()["optimization"]["critic_lr"] == 1e-4  # kept
    combo.setCurrentIndex(combo.findData("dmad"))
    assert greyed(panel) == LCM_ONLY
    assert "unused with method dmad" in panel.form.rows[("distillation", "lcm_huber_c")].editor.toolTip()
    assert "unused" not in panel.form.rows[("optimization", "critic_lr")].editor.toolTip()


def test_a_method_typed_in_the_json_greys_the_form_too(qtbot, panel):
    raw = panel.config()
    raw["distillation"]["method"] = "lcm"
    with qtbot.waitSignal(panel.json.json_parsed, timeout=None):
        panel.json.edit.setPlainText(json.dumps(raw))
    assert panel.form.rows[METHOD].editor.control().currentText() == "LCM (lcm)"
    assert greyed(panel) == UNUSED_WITH_LCM
    raw["distillation"]["method"] = "dmd3"  # the engine rejects it; nothing is greyed for a method nobody knows
    with qtbot.waitSignal(panel.json.json_parsed, timeout=None):
        panel.json.edit.setPlainText(json.dumps(raw))
    assert not panel.is_valid() and panel.form.error_of(METHOD) and greyed(panel) == []


def test_the_unused_map_names_real_schema_fields(panel):
    for method, info in METHODS.items():
        assert set(info.settings) <= set(panel.form.rows), method
    assert sorted(unused_settings("lcm")) == sorted(UNUSED_WITH_LCM)
    assert sorted(unused_settings("dmad")) == sorted(LCM_ONLY)
    assert panel.form.rows[METHOD].spec.options == tuple(METHODS)  # every method has a name
    assert DEFAULT_METHOD == methods.DEFAULT == panel.form.rows[METHOD].spec.default


# ------------------------------------------------------------ presets

def test_every_preset_says_its_method_and_its_config_agrees():
    listed = presets()
    assert {p.method for p in listed} == {"dmad", "lcm"}
    for preset in listed:
        assert load_config(preset.path).distillation.method == preset.method, preset.name
        assert preset.menu_text() == f"{preset.name} \u00b7 {'LCM' if preset.method == 'lcm' else 'DMAD'}"


def test_the_demo_descriptions_quote_their_configs():
    for start in ("CPU demo", "CPU demo \u2014 LCM"):
        preset = preset_named(start)
        cfg = load_config(preset.path)
        assert f"{cfg.optimization.max_train_steps} iterations" in preset.description, start
        assert f"batch {cfg.resources.train_batch_size}" in preset.description
    lcm = preset_named("CPU demo \u2014 LCM")
    cfg = load_config(lcm.path)
    ts = "/".join(str(t) for t in cfg.distillation.resolved_student_timesteps())
    assert ts == "999/759/499/259" and ts in lcm.description
    assert f"{cfg.distillation.lcm_ddim_timesteps} timesteps" in lcm.description
    assert f"CFG {cfg.distillation.real_guidance_scale:g}" in lcm.description
    assert cfg.distillation.lcm_loss_type == "l2" and "squared-error loss (L2" in lcm.description
    assert f"decay {cfg.distillation.lcm_target_ema_decay:g}" in lcm.description
    assert "lr " + f"{cfg.optimization.generator_lr:.0e}".replace("e-0", "e-") in lcm.description  # 3e-5
    assert "dmad bench distill --methods dmad,lcm" in lcm.description


def test_the_chooser_shows_the_method(panel):
    every = panel.preset_button.menu().actions()
    actions = every[:len(presets())]  # then the user's own, Save as preset… and Delete
    assert [a.text() for a in actions] == [p.menu_text() for p in presets()]
    assert [a.text() for a in every[-2:]] == ["Save as preset…", "Delete a preset of yours"]
    assert actions[0].text() == "CPU demo \u00b7 DMAD"
    lcm = next(a for a in actions if a.text().endswith("\u00b7 LCM"))
    assert lcm.text().startswith("CPU demo \u2014 LCM") and lcm.toolTip().startswith("Method: LCM (lcm), latent")
    assert actions[0].toolTip().startswith("Method: DMAD (dmad)")


def test_the_lcm_preset_loads_as_a_valid_lcm_config(panel):
    assert panel.load_preset(preset_named("CPU demo \u2014 LCM"))
    assert panel.is_valid(), panel.validity_message()
    assert panel.config()["distillation"]["method"] == "lcm"
    assert panel.form.rows[METHOD].editor.control().currentText() == "LCM (lcm)"
    assert greyed(panel) == UNUSED_WITH_LCM
    assert load_config(panel.materialize()).distillation.method == "lcm"  # what Start would run


@pytest.mark.parametrize("entry, words", [({"method": "dmd3"}, "has method 'dmd3'; expected one of dmad, lcm"),
                                          ({"method": None}, "has method None"),
                                          ({}, "needs name, file, description and method")])
def test_a_broken_preset_method_is_one_line_naming_the_index(tmp_path, entry, words):
    index = tmp_path / "index.json"
    base = {"name": "x", "file": "x.json", "description": "d"}
    index.write_text(json.dumps({"presets": [{**base, **entry}]}))
    with pytest.raises(UserInputError) as e:
        presets(index)
    assert str(index) in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------ the Training plots

def lcm_metric(it: int) -> dict:
    """An LCM run's metric event data: the DMAD columns are null (empty cells in metrics.csv)."""
    data = {k: None for k in DMAD_COLUMNS}
    data.update(loss_lcm=0.2 / it, grad_norm_g=0.9, step_time_s=0.4, data_time_s=0.01, mem_peak_alloc_gb=None,
                mem_device_used_gb=0.8, lr_generator=1e-4, lr_critic=None)
    return data


def shown(board: PlotBoard) -> list[str]:
    """The method's plots shown (the Health page's are every method's: tests/app/test_health_page.py)."""
    return [p.spec.name for p in board.shown_plots() if not p.spec.name.startswith("health_")]


def test_an_lcm_stream_plots_loss_lcm_and_no_critic_plots(qtbot, board):
    assert shown(board) == ["generator", "critic", "accuracy", "gradients", "lr"]  # nothing known yet: DMAD's
    store = SeriesStore()
    for it in range(1, 21):
        store.add_metric(it, lcm_metric(it), t=1.7e9 + it)
    board.refresh(store, store.take_dirty())
    assert board.method() == "lcm"
    assert shown(board) == ["lcm", "gradients", "lr"]
    assert [board.tabs.tabText(i) for i in range(2)] == ["Losses", "Gradients · LR"]
    x, y = board.plot_named("lcm").curve("loss_lcm").getData()
    assert list(x) == list(range(1, 21)) and y[0] == pytest.approx(0.2)
    assert board.loss_keys() == ["loss_lcm"]
    assert board.plot_named("lcm").legend.entry("loss_lcm").toolTip().startswith(LCM_TIP + "\n")
    board.tabs.setCurrentIndex(1)
    assert board.gradients.keys_with_data() == ["grad_norm_g"]  # no entry for the critic's empty column
    assert board.lr.keys_with_data() == ["lr_generator"]
    assert board.tabs.currentWidget().isVisible() and not board.plot_named("accuracy").isVisible()


def test_the_runs_config_sets_the_plots_before_any_metric(qtbot, board):
    board.set_method("lcm")
    assert shown(board) == ["lcm", "gradients", "lr"] and board.plot_named("lcm").is_empty()
    board.set_method("dmad")
    assert shown(board) == ["generator", "critic", "accuracy", "gradients", "lr"]
    board.set_method(None)
    assert board.method() == methods.DEFAULT


def write_lcm_run(root: Path, name: str, iters=range(1, 11)) -> RunFolder:
    """An LCM run folder as the engine leaves it: its config, events and metrics.csv with empty DMAD cells."""
    run = RunFolder.create(root / name)
    atomic_write_json(run.config_json, {"config_version": 2, "distillation": {"method": "lcm"}})
    lines = [make_event("started", None, run_dir=str(run.path), max_train_steps=100)]
    lines += [make_event("metric", it, max_train_steps=100, **lcm_metric(it)) for it in iters]
    run.events_jsonl.write_text("".join(ev.to_line() + "\n" for ev in lines))
    columns = ["iter", *DMAD_COLUMNS, "loss_lcm", "grad_norm_g", "step_time_s", "lr_generator", "lr_critic"]
    with open(run.metrics_csv, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        for it in iters:
            m = lcm_metric(it)
            w.writerow({c: "" if m.get(c) is None else m[c] for c in columns if c != "iter"} | {"iter": it})
    atomic_write_json(run.status_json, {"state": "finished", "pid": os.getpid(), "host": socket.gethostname(),
                                        "heartbeat": time.time()})
    return run


def test_the_training_panel_takes_the_method_from_the_runs_config(qtbot, tmp_path, open_and_wait):
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    panel.resize(1280, 800)
    panel.show()
    run = write_lcm_run(tmp_path, "lcm_run", iters=range(1, 11))
    open_and_wait(panel, run.path)
    board = panel.loss_plot
    assert shown(board) == ["lcm", "gradients", "lr"]  # from config.json, before the replay draws anything
    qtbot.waitUntil(lambda: board.plot_named("lcm").keys_with_data() == ["loss_lcm"], timeout=WAIT_MS)
    assert list(board.plot_named("lcm").curve("loss_lcm").getData()[0]) == list(range(1, 11))
    assert all(board.plot_named(name).isHidden() for name in ("critic", "generator", "accuracy"))
    dmad = RunFolder.create(tmp_path / "dmad_run")  # an empty DMAD run: its own layout, not the last run's
    # written before the method was called "dmad": its older word still means DMAD
    atomic_write_json(dmad.config_json, {"config_version": 2, "distillation": {"method": "dmd2"}})
    atomic_write_json(dmad.status_json, {"state": "stopped", "pid": os.getpid(), "host": socket.gethostname(),
                                         "heartbeat": time.time()})
    dmad.events_jsonl.write_text("")
    open_and_wait(panel, dmad.path)
    assert shown(board) == ["generator", "critic", "accuracy", "gradients", "lr"]
    assert board.plot_named("lcm").isHidden() and board.plot_named("critic").is_empty()


def test_an_lcm_run_compared_with_a_dmad_run_gets_its_own_plot(qtbot, board, tmp_path):
    store = SeriesStore()
    for it in range(1, 11):
        store.add_metric(it, {"loss_dm": 1.0 / it, "loss_c": 0.1, "grad_norm_g": 1.0}, t=1.7e9 + it)
    board.refresh(store, store.take_dirty())
    assert "lcm" not in shown(board)
    run = write_lcm_run(tmp_path, "lcm_run")
    board.add_overlay_dir(run.path)
    qtbot.waitUntil(lambda: board.overlay_names() == ["lcm_run"], timeout=WAIT_MS)
    assert shown(board) == ["generator", "critic", "lcm", "accuracy", "gradients", "lr"]
    assert list(board.plot_named("lcm").overlay_curves("lcm_run")) == ["loss_lcm"]
    assert board.plot_named("critic").overlay_curves("lcm_run") == {}  # its empty DMAD columns are no curves
    board.remove_overlay("lcm_run")
    assert "lcm" not in shown(board)


# ------------------------------------------------------------ runs table, config diff, provenance

def test_the_runs_table_shows_the_method_and_no_critic_rate_for_lcm(qtbot, tmp_path):
    write_listed_run(tmp_path, "dmad")
    run = write_listed_run(tmp_path, "lcm", config=_config(distillation={"method": "lcm", "student_steps": 4}))
    with open(run / "metrics.csv", "w", newline="") as f:  # an LCM run's last row: DMAD cells empty
        f.write("iter,loss_dm,loss_c,loss_lcm,lr_generator,lr_critic\n20,,,0.0125,0.0001,\n")
    panel = open_panel(qtbot, tmp_path)
    assert cell(panel, "dmad", "Method") == "DMAD" and cell(panel, "lcm", "Method") == "LCM"
    assert cell(panel, "lcm", "Method", TIP).startswith("LCM (lcm): latent consistency distillation")  # tooltip
    assert cell(panel, "dmad", "Learning rates (G / C)") == "0.0001 / 2e-05"
    assert cell(panel, "lcm", "Learning rates (G / C)") == "0.0001 / -"
    assert "no critic with method lcm" in cell(panel, "lcm", "Learning rates (G / C)", TIP)
    assert cell(panel, "lcm", "Last losses") == "lcm 0.0125"
    tip = cell(panel, "lcm", "Last losses", TIP)
    assert "loss_lcm: 0.0125" in tip and "loss_dm" not in tip and "lr_critic" not in tip


def test_the_config_diff_says_which_values_a_method_does_not_read(qtbot):
    dmad = _config(optimization={"critic_lr": 1e-4})
    lcm = copy.deepcopy(dmad)
    lcm["distillation"]["method"] = "lcm"
    lcm["optimization"]["critic_lr"] = 1e-5
    by_path = {d.path: d for d in diff_configs(dmad, lcm)}
    assert set(by_path) == {"distillation.method", "optimization.critic_lr"}
    assert by_path["optimization.critic_lr"].unused_b == "unused with method lcm"
    assert by_path["optimization.critic_lr"].unused_a == "" and by_path["distillation.method"].unused_b == ""
    dialog = ConfigDiffDialog("dmad", dmad, "lcm", lcm)
    qtbot.addWidget(dialog)
    assert ("optimization.critic_lr", "0.0001", "1e-05  (unused with method lcm)") in dialog.rows()
    assert "1 of them unused by one run's distillation method" in dialog.summary.text()
    dialog.show_all.setChecked(True)
    assert ("distillation.lcm_huber_c", "0.001  (unused with method dmad)", "0.001") in dialog.rows()


def test_provenance_names_the_method_of_a_student_image(tmp_path):
    run = tmp_path / "run"
    for folder, model in (("teacher", "teacher"), ("iter_10", "student")):
        (run / "samples" / folder).mkdir(parents=True)
        (run / "samples" / folder / "p.png").write_bytes(b"png")
        (run / "samples" / folder / "meta.json").write_text(json.dumps({"model": model, "items": {}}))
    (run / "config.json").write_text(json.dumps({"distillation": {"method": "lcm"}}))
    index = scan_samples(run)
    assert ("distilled by", "LCM (lcm)") in provenance(index, 0, 1)
    assert not any(label == "distilled by" for label, _ in provenance(index, 0, 0))  # the teacher is not distilled


def test_an_older_config_that_says_dmd2_opens_as_dmad(qtbot, panel, tmp_path):
    """DMAD's value was "dmd2" until 2026-12: such a config file is still valid and still DMAD."""
    raw = panel.config()
    raw["distillation"]["method"] = "dmd2"
    path = tmp_path / "older.json"
    atomic_write_json(path, raw)
    assert panel.load_file(path)
    assert panel.is_valid(), panel.validity_message()
    assert greyed(panel) == LCM_ONLY  # DMAD's settings, not an unknown method's
    assert (methods.label("dmd2"), methods.short_name("dmd2")) == ("DMAD (dmad)", "DMAD")  # an older samples meta.json
    assert canonical_method("dmd2") == "dmad" and canonical_method("dmd3") == "dmd3"
    from dmad.contract.methods import Distillation

    assert Distillation.model_validate({"method": "dmd2"}).method == "dmad"  # what the engine trains
