"""The distillation methods (the config's distillation.method) as the app names and shows them, without Qt.

The methods are the engine's, described in dmad.contract.methods (METHODS: name, label, what it
trains, its metrics columns and plots, its settings); this module reads them for the app's views:
the Config form greys out the settings the chosen method does not read, the runs table and the
config diff say so, the preset chooser and the samples' provenance name the method.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dmad.contract.jsonfile import read_json_or_problem
from dmad.contract.methods import DEFAULT_METHOD, METHODS, canonical_method, empty_columns, unused_settings

METHOD_KEY = ("distillation", "method")
DEFAULT = DEFAULT_METHOD  # what a config without the key means
LABELS = {name: m.label for name, m in METHODS.items()}  # the form's combo box: the name and the value
WHAT = {name: m.what for name, m in METHODS.items()}
# metrics.csv columns (= metric event fields) a run of the method leaves empty
EMPTY_COLUMNS = {name: empty_columns(name) for name in METHODS}


def method_of(config: Any) -> Any:
    """The method a raw config names: its distillation.method (an older word read as today's; an
    invalid value stays as it is, for the engine to reject), DEFAULT when the key is absent."""
    group = config.get("distillation") if isinstance(config, dict) else None
    return canonical_method(group.get("method", DEFAULT)) if isinstance(group, dict) else DEFAULT


def short_name(method: Any) -> str:
    """"DMAD", the method's short name; a value the app does not know is shown as it is."""
    info = METHODS.get(canonical_method(method)) if isinstance(method, str) else None
    return info.short if info is not None else str(method)


def label(method: Any) -> str:
    """"DMAD (dmad)"; an older word (a samples meta.json's "dmd2") as today's method."""
    return LABELS.get(canonical_method(method), str(method)) if isinstance(method, str) else str(method)


def unused_note(method: Any) -> str:
    return f"unused with method {method}"


def unused_fields(method: Any) -> dict[tuple[str, ...], str]:
    """{key: "unused with method <method>"} for the settings `method` does not read ({} for an unknown one)."""
    return {key: unused_note(method) for key in _unused(method)}


def is_unused(method: Any, dotted: str) -> bool:
    """"optimization.critic_lr" is not read by a method without a critic."""
    return tuple(dotted.split(".")) in _unused(method)


def _unused(method: Any) -> tuple[tuple[str, str], ...]:
    return unused_settings(method) if isinstance(method, str) else ()


def read_method(config_path: Path) -> Optional[str]:
    """The method of a config file (a run's config.json), None when it cannot be read. Bounded and
    non-blocking (read_json_or_problem), but a read all the same: call it in a pool worker."""
    raw, problem = read_json_or_problem(config_path)
    if problem:
        return None
    method = method_of(raw)
    return method if isinstance(method, str) else None
