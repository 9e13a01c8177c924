"""The daemons of another tree, for A/B runs: ``--tree PATH_OR_COMMIT``, one meaning.

Every benchmark that starts gateway daemons takes ``--tree`` (repeatable): it measures
this tree's daemons and, alternately, run by run, each other tree's, so that all of them
see the same machine; its rows and records say which tree each came from. The trainers,
the emulator and the bench itself are always this tree's. A tree is

- a folder holding a ``wangate`` package: a checkout, or an export
  (``git archive REV wangate | tar -x -C DIR``);
- or a git revision of this repository (a commit, a branch, a tag), exported once into
  ``results/trees/<commit>/``, its native parts built there by its own setup.py, and
  reused.

A daemon runs a tree's code because its environment puts the tree first on its path
(``PYTHONPATH``) and keeps its working folder off it (``PYTHONSAFEPATH``: ``python -m``
would otherwise put the working folder, often this repository, first). This tree is
named the same way, so that where a daemon is started from never decides its code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.common import RESULTS, ROOT

EXPORTS = RESULTS / "trees"


@dataclass(frozen=True)
class Tree:
    root: Path  # the folder holding its ``wangate`` package
    label: str  # how rows and records name it: "this tree", a commit, or a folder

    @property
    def is_this(self) -> bool:
        return self.root == ROOT

    @property
    def slug(self) -> str:
        """A folder name for its results."""
        return "this" if self.is_this else self.label.replace("/", "_").strip("_")

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) for a process that runs this
        tree's ``wangate``."""
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")]))
        env["PYTHONSAFEPATH"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Daemons this process starts inside the block (``LoopbackSites`` start and
        restart them with its own environment) run this tree."""
        saved = dict(os.environ)
        os.environ.update(self.environ())
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


THIS = Tree(ROOT, "this tree")


def _git(*args: str, where: Path = ROOT) -> str:
    return subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def resolve(value: str) -> Tree:
    """The tree ``value`` names: a folder holding ``wangate/``, or a git revision."""
    folder = Path(value).expanduser()
    if folder.is_dir():
        if not (folder / "wangate" / "__init__.py").is_file():
            raise SystemExit(f"--tree {value}: no wangate package in that folder")
        folder = folder.resolve()
        return THIS if folder == ROOT else Tree(folder, str(folder))
    try:
        commit = _git("rev-parse", "--verify", "--short=12", f"{value}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--tree {value}: neither a folder nor a git revision") from None
    export = EXPORTS / commit
    if not (export / BUILT).is_file():
        _export(commit, export)
    return Tree(export, commit)


BUILT = ".built"  # an export's marker: extracted, and its extensions built


def _export(commit: str, export: Path) -> None:
    """``commit``'s package into ``export``, with what its setup.py builds (its engine,
    its compiled core) built in place, as pip builds them for a checkout."""
    export.mkdir(parents=True, exist_ok=True)
    paths = ["wangate"]
    for name in ("setup.py", "pyproject.toml"):
        probe = ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{name}"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            paths.append(name)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, *paths], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive.stdout, check=True)
    if (export / "setup.py").is_file():
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=export, check=True
        )
    (export / BUILT).touch()


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="PATH_OR_COMMIT",
        help="also run the daemons of this tree (a folder holding a wangate package, or a "
        "git revision), alternately with this tree's; repeatable",
    )


def trees(args: argparse.Namespace) -> list[Tree]:
    """This tree, then each ``--tree`` once."""
    found = [THIS]
    for value in args.tree:
        tree = resolve(value)
        if tree not in found:
            found.append(tree)
    return found


def version(tree: Tree) -> str:
    """The commit a tree's code is, and whether its wangate/ differs from it."""
    if tree.root.parent == EXPORTS:
        return tree.label
    try:
        head = _git("rev-parse", "--short", "HEAD", where=tree.root)
        dirty = _git("status", "--porcelain", "wangate", where=tree.root)
    except (OSError, subprocess.CalledProcessError):
        return f"{tree.root} (not a git checkout)"
    return f"{head}{' with uncommitted changes to wangate/' if dirty else ''} ({tree.root})"
