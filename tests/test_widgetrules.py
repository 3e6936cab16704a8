"""The widget allow-list (daytona_kernel/widgetrules.py) is what the installed ipywidgets ships, no more."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import ipywidgets
from ipywidgets import Widget

from daytona_kernel.widgetrules import ALLOWED, IDENTITY_KEYS, SHIPPED_VERSIONS, identity_of, is_allowed


def _classes(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _classes(sub)


def shipped() -> set[tuple[Any, ...]]:
    """The six names of every widget class in ipywidgets, from its trait defaults."""
    names = set()
    for cls in [Widget, *_classes(Widget)]:
        if cls.__module__.startswith("ipywidgets."):
            traits = cls.class_traits()
            names.add(identity_of({key: traits[key].default_value for key in IDENTITY_KEYS}))
    return names


def test_the_allow_list_is_every_widget_ipywidgets_ships_and_nothing_else() -> None:
    names = shipped()
    assert ipywidgets.__version__.startswith("8.")
    assert not [n for n in names if not is_allowed(n)]
    listed = {(n[0], n[2], n[3], n[5]) for n in names}
    assert listed == set(ALLOWED)
    assert {(n[0], n[1]) for n in names} <= set(SHIPPED_VERSIONS.items())


def test_the_widget_threat_table_names_every_hostile_comms_test_and_only_tests_that_exist() -> None:
    """docs/security-output.md's widget threats stay in step with the tests."""
    root = Path(__file__).resolve().parent
    text = (root.parent / "docs" / "security-output.md").read_text()
    table = text[text.index("## Widgets") : text.index("## Trusting a sandbox")]
    named = set(re.findall(r"::(test_\w+)", table))
    defined = {m for path in root.glob("test_*.py") for m in re.findall(r"^def (test_\w+)", path.read_text(), re.M)}
    hostile = set(re.findall(r"^def (test_\w+)", (root / "test_hostile_comms.py").read_text(), re.M))
    assert named <= defined, sorted(named - defined)
    assert hostile <= named, sorted(hostile - named)
