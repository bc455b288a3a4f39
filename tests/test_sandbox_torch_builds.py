"""The sandbox on the torch a learner really gets. PyPI's Linux torch loads cuDNN, cuBLAS, NCCL
... by path from the ``nvidia`` package beside it, even with no GPU; the sandbox showed the
Python modules torch imports and not those libraries, so every torch set (03 on) was "not
graded: the runner did not start (ImportError: libcudnn.so.9: cannot open shared object file)"
for everyone who installed torch the usual way. Tested here without the 6 GB install: a fake
package loads a shared library by path from a sibling package, as torch does; `make test
PYTHON=python3.13` runs the whole suite on PyPI's build itself."""

import glob
import os
import shutil
import subprocess

import pytest

from txlearn.course.grading import installation, sandbox

LIMITS = {"memory_mb": 2048, "cpu_seconds": 60, "processes": 64, "wall_seconds": 60,
          "file_mb": 16, "open_files": 256}

# what torch/__init__.py does with nvidia/*/lib: load by absolute path, before any import of it
TORCHLIKE = '''import ctypes, os
_here = os.path.dirname(os.path.abspath(__file__))
ctypes.CDLL(os.path.join(_here, "fake_nvidia", "cudnn", "lib", "libfake_cudnn.so.9"))
LOADED = True
'''


def _shared_library():
    """A real shared library to copy under another name: zlib's, which every Linux has."""
    found = sorted(glob.glob("/usr/lib/*/libz.so.1") + glob.glob("/usr/lib/libz.so.1") +
                   glob.glob("/lib/*/libz.so.1") + glob.glob("/usr/lib64/libz.so.1"))
    assert found, "no libz.so.1 under /usr/lib or /lib to copy"
    return os.path.realpath(found[0])


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages folder on the grader's path holding `faketorch` (a module) and
    `fake_nvidia` (a folder of shared libraries and no Python module), and `unrelated` (a
    package nothing imports, which must stay hidden)."""
    folder = tmp_path / "lib" / "site-packages"
    lib = folder / "fake_nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    shutil.copy(_shared_library(), lib / "libfake_cudnn.so.9")
    (folder / "faketorch.py").write_text(TORCHLIKE)
    (folder / "unrelated").mkdir()
    (folder / "unrelated" / "__init__.py").write_text("")
    for path in [tmp_path, *tmp_path.rglob("*")]:   # the runner's uid must read them
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    exe, roots, path, masks = sandbox.python_layout()
    layout = lambda: (exe, roots + (str(folder),), path + (str(folder),), masks)  # noqa: E731
    monkeypatch.setattr(sandbox, "python_layout", layout)        # what bwrap_argv binds
    monkeypatch.setattr(installation, "python_layout", layout)   # where the probe looks
    installation.package_entries.cache_clear()   # it is cached by the imports alone
    yield folder
    installation.package_entries.cache_clear()


def test_the_shared_libraries_an_import_loads_are_shown_and_nothing_else(site):
    entries = installation.package_entries(("faketorch",))
    assert str(site / "faketorch.py") in entries
    assert str(site / "fake_nvidia") in entries      # no module of it was imported: only its library
    assert str(site / "unrelated") not in entries


def test_a_torch_like_import_that_loads_a_library_by_path_works_in_the_sandbox(site, tmp_path):
    ok, bwrap = sandbox.available()
    assert ok, bwrap
    entries = installation.package_entries(("faketorch",))
    python = sandbox.python_layout()[0]
    code = (f"import sys; sys.path.insert(0, {str(site)!r}); import faketorch; "
            f"print('loaded', faketorch.LOADED)\n"
            f"try:\n    import unrelated\nexcept ImportError:\n    print('unrelated hidden')\n")
    argv = sandbox.bwrap_argv(bwrap, view_dir=str(tmp_path), files=[], limits=LIMITS,
                              tail=[python, "-I", "-S", "-c", code], packages=entries)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[:2] == ["loaded True", "unrelated hidden"], done.stderr[-800:]


def test_a_sets_memory_limit_is_the_learners_on_any_build_of_torch(tmp_path):
    """The runner's address space is capped at what its preloaded imports map plus the set's
    ``memory_mb`` (less its files). PyPI's CUDA build of torch maps about 3.2 GB at import, the
    CPU build 0.6 GB: counted inside the limit, it left a set-03 learner on the CUDA build about
    600 MB of the default 4096 and made a 4 MB list a MemoryError under a tighter limit. Here the
    limit is no larger than torch's own mapping, and the learner's 512 MB still fit."""
    import json

    from txlearn.course import build, grading
    from txlearn.course.grading import runner_pool, sets

    heads = build.ROOT / "exercises" / "solutions" / "03_heads.ipynb"
    preload = runner_pool.preload(sets.load_set(build.ROOT / "exercises" / "source" /
                                                "03_heads.py"))
    assert "torch" in preload, preload
    base = installation.import_mb(preload)
    assert base > 300, base          # numpy and torch map hundreds of MB on any build
    nb = json.loads(heads.read_text())
    for cell in nb["cells"]:
        meta = cell.get("metadata", {})
        if meta.get("exercise") == "multi_head_attention" and "answer" in meta.get("tags", []):
            cell["source"] = "".join(cell["source"]) + \
                "\n_big = torch.ones(128 << 20)   # 512 MB of the learner's own\n"
    path = tmp_path / "alice" / "03_heads.ipynb"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(nb))
    sub, = grading.grade([path], jobs=1, limits={"memory_mb": base, "file_mb": 4,
                                                 "cell_seconds": 60, "call_seconds": 20})
    results = {r.exercise: r for r in sub.results}
    assert results["multi_head_attention"].status == "PASS", \
        results["multi_head_attention"].feedback[:300]
