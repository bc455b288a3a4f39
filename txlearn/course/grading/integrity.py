"""The files-changed watch: what a submission's runner changed outside its private folder.

Before a runner starts and after it stops, the grader takes a fingerprint (size and modification
time) of the folders the runner must not touch (:func:`watched`); any difference becomes an
integrity note. Inside the sandbox nothing of the host is writable, so a note here means a
sandbox that leaked or a run without one (``--no-sandbox``, a learner's own ``work/``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from txlearn.course import build
from txlearn.course.grading import sandbox
from txlearn.course.grading.view import PACKAGE_DIR

__all__ = ["watched", "fingerprint", "changes"]


def watched(sub_path: Path, hidden: Path | None) -> list[Path]:
    """The folders a runner must not change: the package, the exercises, the submission's own
    folder, the installed packages and the hidden cases."""
    _, _, sys_path, _ = sandbox.python_layout()
    out = [PACKAGE_DIR, build.ROOT / "exercises", sub_path.parent]
    out += [Path(p) for p in sys_path if p.endswith("site-packages")]
    if hidden is not None:
        out.append(Path(hidden))
    return out


def fingerprint(folders: list[Path]) -> dict[str, tuple]:
    """Size and modification time of the files in ``folders`` (the package and the exercises
    recursively; a submission's folder and the hidden cases: their own files), and for a
    site-packages folder its listing and the digests of its ``*.pth`` files."""
    out = {}
    for folder in folders:
        recursive = folder in (PACKAGE_DIR, build.ROOT / "exercises")
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            if folder.name == "site-packages":
                for name in dirs + files:
                    key = os.path.join(root, name)
                    out[key] = ("listed",)
                    if name.endswith(".pth"):
                        try:
                            out[key] = (hashlib.sha256(Path(key).read_bytes()).hexdigest(),)
                        except OSError:
                            out[key] = ("unreadable",)
                break
            for name in files:
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out[path] = (st.st_size, st.st_mtime_ns)
            if not recursive:
                break
    return out


def changes(before: dict, after: dict) -> list[str]:
    """The paths whose fingerprint differs between ``before`` and ``after`` (new, gone, changed),
    sorted."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
