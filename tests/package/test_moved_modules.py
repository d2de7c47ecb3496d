"""Old import paths of moved modules (pgcdc/_moved.py): each still imports, warns once
with the new path, and gives the very module at the new path, not a copy."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

import pgcdc
from pgcdc._moved import MOVED

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

ROOT = Path(pgcdc.__file__).parent.parent


def _new_module(new: str):
    try:
        return importlib.import_module(new)
    except ModuleNotFoundError as exc:  # pyarrow / numpy: not in every venv of the fast tier
        pytest.skip(f"{new} needs {exc.name}")


def _forget(monkeypatch, old: str) -> None:
    """As if the old path had never been imported in this process."""
    parent, _, name = old.rpartition(".")
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delattr(importlib.import_module(parent), name, raising=False)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_warns_and_is_the_new_module(monkeypatch, old):
    new = _new_module(MOVED[old])
    _forget(monkeypatch, old)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {MOVED[old]}"):
        got = importlib.import_module(old)
    assert got is new
    assert sys.modules[old] is new
    assert new.__name__ == MOVED[old] and new.__spec__.name == MOVED[old]
    # the second import is the cached module: no second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is new


def test_from_import_of_an_old_name(monkeypatch):
    from pgcdc.runtime.spark import plan

    _forget(monkeypatch, "pgcdc.runtime.spark_plan")
    with pytest.warns(DeprecationWarning) as caught:
        from pgcdc.runtime import spark_plan
        from pgcdc.runtime.spark_plan import compile_plans
    assert spark_plan is plan and compile_plans is plan.compile_plans
    # the warning names the line that imports the old path, not the import system
    assert {Path(w.filename) for w in caught} == {Path(__file__)}


def test_old_paths_are_not_files():
    """The old names live only in MOVED: no stub module is left behind."""
    for old in MOVED:
        path = ROOT.joinpath(*old.split("."))
        assert not path.with_suffix(".py").exists(), old
        assert not path.exists(), old


def test_unknown_names_stay_unknown():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pgcdc.runtime.spark_nothing")
