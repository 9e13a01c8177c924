"""No two public classes of the package share a name: a reader who meets one never has
to ask which it is (an error and an event, say). A name bound in several modules to
the same class (a re-export) is one class."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict

import wangate


def public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(wangate.__path__, "wangate."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return names


def test_no_two_public_classes_share_a_name() -> None:
    classes: defaultdict[str, set[str]] = defaultdict(set)
    for name in public_modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("wangate"):
                continue  # needs an optional extra that is not installed (torch)
            raise
        for attr, value in vars(module).items():
            if attr.startswith("_") or not inspect.isclass(value):
                continue
            if value.__module__.startswith("wangate.") and not value.__name__.startswith("_"):
                classes[value.__name__].add(f"{value.__module__}.{value.__qualname__}")
    assert len(classes) > 100  # the walk found the package
    assert {name: sorted(where) for name, where in classes.items() if len(where) > 1} == {}
