"""The grader's Python installation: where its interpreter and packages lie, and which installed
packages (and the shared libraries they load) the sandbox shows its runner. The sandbox
(:mod:`txlearn.course.grading.sandbox`) binds what this module lists and hides the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

__all__ = ["python_layout", "package_entries", "data_entries", "site_packages",
           "other_package_folders", "under"]


# ---- the Python the runner uses ------------------------------------------------------------------

def under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies below it (as strings: no link is followed)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


@lru_cache(maxsize=1)
def python_layout() -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """``(interpreter, roots, sys_path, masks)``: the interpreter the grader runs on, the folders
    that hold it and its packages (to bind read-only; ``/usr`` is bound anyway), the grader's
    ``sys.path`` entries inside those folders, and installed copies of ``txlearn`` to hide."""
    exe = os.path.realpath(sys.executable)
    roots = []
    packages = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")
                and os.path.isdir(p)]   # also those a .pth file or PYTHONPATH added
    for root in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(exe)), *packages):
        root = os.path.abspath(root)
        if under(root, "/usr") or any(under(root, r) for r in roots):
            continue
        roots = [r for r in roots if not under(r, root)] + [root]
    bound = roots + ["/usr"]
    path = tuple(p for p in sys.path if p and os.path.isabs(p) and os.path.exists(p)
                 and any(under(p, r) for r in bound))
    masks = []
    import txlearn
    package = str(Path(txlearn.__file__).resolve().parent)
    for entry in path:
        candidate = os.path.join(entry, "txlearn")
        if os.path.isdir(candidate) or os.path.realpath(candidate) == package:
            masks.append(candidate)
    return exe, tuple(roots), path, tuple(masks)


# ---- which installed packages the sandbox shows ----------------------------------------------------

_PROBE = r"""
import json, sys
sys.path[:] = json.loads(sys.argv[1])
import numpy
import torch, torch.nn, torch.nn.functional
torch.ones(2, requires_grad=True).sum().backward()
for name in ["sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec"]:
    try:            # torch's own dependencies, some imported only on first use (sympy by autograd)
        __import__(name)
    except ImportError:
        pass
for name in json.loads(sys.argv[2]):
    __import__(name)
files = set()
for module in list(sys.modules.values()):
    paths = [getattr(module, "__file__", None)]
    try:
        paths += list(getattr(module, "__path__", None) or [])
    except TypeError:   # a namespace object that is not a list of folders
        pass
    files.update(p for p in paths if isinstance(p, str))
try:    # the shared libraries they loaded: PyPI's torch loads CUDA's from the nvidia/* packages
    with open("/proc/self/maps") as maps:
        files.update(f[5].strip() for f in (line.split(None, 5) for line in maps)
                     if len(f) == 6 and f[5].startswith("/"))
except OSError:
    pass
print(json.dumps(sorted(files)))
"""


_MAPPED_PROBE = """
import json, sys
sys.path[:] = json.loads(sys.argv[1])
for name in json.loads(sys.argv[2]):
    __import__(name)
with open("/proc/self/status") as status:
    print(next(int(line.split()[1]) >> 10 for line in status if line.startswith("VmSize:")))
"""


@lru_cache(maxsize=8)
def import_mb(imports: tuple[str, ...]) -> int:
    """The address space in MB that a process of the sandbox's interpreter maps once it has
    imported ``imports`` (a set's preloaded modules: NumPy, PyTorch), before any learner code:
    about 0.6 GB with the CPU build of torch 2.13, 3.2 GB with PyPI's CUDA build of 2.14 (its
    CUDA libraries are mapped, not used). The runner's address-space limit is counted above it,
    so that a set's ``memory_mb`` is the learner's on every build. Measured once per process in
    a probe (``VmSize``); 0 when it cannot be."""
    python, _, sys_path, _ = python_layout()
    try:
        run = subprocess.run([python, "-I", "-S", "-B", "-c", _MAPPED_PROBE,
                              json.dumps(list(sys_path)), json.dumps(list(imports))],
                             capture_output=True, text=True, timeout=300)
        return int(run.stdout.strip()) if run.returncode == 0 else 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


def site_packages() -> list[str]:
    """Every site-packages folder the sandbox binds (the venv's and the base interpreter's)."""
    import sysconfig
    out = {p for p in python_layout()[2] if os.path.basename(p) in ("site-packages",
                                                                    "dist-packages")}
    for prefix in (sys.base_prefix, sys.prefix):
        purelib = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})["purelib"]
        if os.path.isdir(purelib):
            out.add(purelib)
    return sorted(out)


@lru_cache(maxsize=32)
def package_entries(imports: tuple[str, ...]) -> tuple[str, ...]:
    """The entries of the site-packages folders (package folders, module files, their
    ``.libs`` and ``.dist-info``) that numpy, torch and the top-level modules ``imports`` load,
    and the entries holding the shared libraries they load (PyPI's Linux torch loads cuDNN,
    cuBLAS, NCCL ... from the ``nvidia`` package beside it, by path, even with no GPU): the
    sandbox shows these and nothing else installed, so an answer cannot reach another package
    (scipy, transformers, ...) by any spelling of an import. Found by importing them in a probe
    process of the same interpreter and reading its memory map; raises RuntimeError when one
    cannot be imported."""
    python, _, sys_path, _ = python_layout()
    run = subprocess.run([python, "-I", "-S", "-B", "-c", _PROBE, json.dumps(list(sys_path)),
                          json.dumps(list(imports))], capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"the sandbox's packages could not be listed: "
                           f"{(run.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    tops = set()
    for site in site_packages():
        for root in {site, os.path.realpath(site)}:   # the memory map holds resolved paths
            for path in json.loads(run.stdout):
                if under(path, root) and path != root:
                    tops.add(os.path.join(site, os.path.relpath(path, root).split(os.sep)[0]))
    extra = set()
    for top in tops:   # a package's compiled libraries and its metadata sit beside it
        site, name = os.path.split(top)
        stem = name.split(".")[0].lower().replace("-", "_")
        for entry in os.listdir(site):
            low = entry.lower().replace("-", "_")
            if low.startswith(stem + ".libs") or (low.startswith(stem + "_") and
                                                  low.endswith(".dist_info")) or \
                    low.startswith(stem + ".dist_info") or low == stem + ".libs":
                extra.add(os.path.join(site, entry))
    return tuple(sorted(tops | extra))


def data_entries(distributions: tuple[str, ...]) -> tuple[str, ...]:
    """The site-packages entries (package folders, ``.dist-info``) holding the files of the
    installed ``distributions`` (pip names, as in a set's ``data:``), shown read-only so that
    answers can read them (set 10's GGUF file) without importing them: the import rule refuses
    a package the set does not declare. Raises RuntimeError naming the install command when one
    is not installed."""
    import importlib.metadata
    sites = site_packages()
    out = set()
    for name in distributions:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise RuntimeError(f"the set reads the files of {name}, which is not installed "
                               f"(pip install {name})") from None
        for file in dist.files or ():
            path = os.path.abspath(dist.locate_file(file))
            for site in sites:
                if under(path, site) and path != site:
                    out.add(os.path.join(site, os.path.relpath(path, site).split(os.sep)[0]))
    return tuple(sorted(out))


def other_package_folders() -> list[str]:
    """The ``site-packages`` and ``dist-packages`` folders under ``/usr`` that the grader's Python
    does not read (Debian's ``python3-*`` packages, another Python's pip installs): bound with
    ``/usr``, an answer could put them on ``sys.path`` and import what the set does not declare."""
    import glob
    mine = set(site_packages())
    found = set()
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages"):
        for folder in glob.glob(pattern):
            if os.path.basename(folder) in ("site-packages", "dist-packages") and \
                    os.path.isdir(folder) and not os.path.islink(folder) and folder not in mine:
                found.add(folder)
    return sorted(found)
