"""Container mode (issue 36): grading where bubblewrap cannot make its namespaces (Docker's default
seccomp profile refuses user namespaces), for systems that give each submission a container of
its own (Gradescope, a Kubernetes job). docs/containers.md says what it protects and what not."""

import json
import os
import shutil
from pathlib import Path

import pytest

from txlearn.course import build, grading
from txlearn.course.grading import sandbox
from txlearn.course.grading.sets import GradingError

SOLUTION = build.ROOT / "exercises" / "solutions" / "01_softmax.ipynb"


@pytest.fixture
def no_bwrap(tmp_path, monkeypatch):
    """A PATH whose ``bwrap`` fails the way it does in a Docker container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely "
                    "because the kernel does not allow non-privileged user namespaces.' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    monkeypatch.delenv("TXLEARN_SANDBOX", raising=False)
    sandbox.available.cache_clear()
    yield
    sandbox.available.cache_clear()


def _submission(tmp_path, name="alice", extra=""):
    nb = json.loads(SOLUTION.read_text())
    if extra:
        for cell in nb["cells"]:
            if "answer" in cell.get("metadata", {}).get("tags", []):
                cell["source"] = extra + "".join(cell["source"])
                break
    path = tmp_path / "submissions" / name / SOLUTION.name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(nb))
    return path


def test_without_namespaces_the_message_names_container_mode(no_bwrap, tmp_path):
    ok, why = sandbox.available()
    assert not ok and "No permissions to create new namespace" in why, why
    with pytest.raises(GradingError) as err:
        grading.sandbox_modes([_submission(tmp_path)])
    text = str(err.value)
    assert "\n" not in text, text
    assert "--container" in text and "TXLEARN_SANDBOX=container" in text, text
    assert "No permissions to create new namespace" in text, text


def test_the_mode_is_chosen_by_option_or_environment(no_bwrap, tmp_path, monkeypatch):
    path = _submission(tmp_path)
    assert grading.sandbox_modes([path], container=True) == ["container"]
    monkeypatch.setenv("TXLEARN_SANDBOX", "container")
    assert grading.sandbox_modes([path]) == ["container"]


def test_the_solution_gets_full_marks_in_container_mode(no_bwrap, tmp_path):
    sub, = grading.grade([_submission(tmp_path)], jobs=1, container=True)
    assert sub.mode == "container" and not sub.error, sub.error
    assert sub.results and all(r.status == "PASS" for r in sub.results), \
        [(r.exercise, r.status, r.feedback[:200]) for r in sub.results]


def test_memory_far_over_the_limit_is_stopped_by_it_in_container_mode(no_bwrap, tmp_path):
    # 8 GiB of address space against a 1 GB limit: refused at once (np.empty touches nothing,
    # so without a limit it would simply succeed and the answer would pass)
    hog = "import numpy as _np\n_hog = _np.empty(8 << 30, dtype=_np.uint8)\n"
    sub, = grading.grade([_submission(tmp_path, extra=hog)], jobs=1, container=True,
                         limits={"memory_mb": 1024})
    assert sub.mode == "container" and not sub.error, sub.error
    results = {r.exercise: r for r in sub.results}
    first = sub.results[0]       # the exercise whose answer cell holds the allocation
    assert first.status in ("FAIL", "ERROR") and "MemoryError" in first.feedback, \
        (first.status, first.feedback[:500])
    # the grader lived on: the notebook's other answers were graded as usual
    assert all(r.status == "PASS" for n, r in results.items() if n != first.exercise), \
        [(r.exercise, r.status) for r in sub.results]


def test_the_seccomp_filter_holds_in_container_mode(no_bwrap, tmp_path):
    # no process and no socket of its own: fork and socket fail inside the runner
    probe = ("import os as _os, socket as _socket\n"
             "try:\n    _pid = _os.fork()\nexcept OSError as _e:\n    _fork = 'refused'\n"
             "else:\n    _os._exit(0) if _pid == 0 else None\n    _fork = 'forked'\n"
             "try:\n    _socket.socket()\nexcept OSError:\n    _sock = 'refused'\n"
             "else:\n    _sock = 'made'\n"
             "assert (_fork, _sock) == ('refused', 'refused'), (_fork, _sock)\n")
    sub, = grading.grade([_submission(tmp_path, extra=probe)], jobs=1, container=True)
    assert not sub.error, sub.error
    assert all(r.status == "PASS" for r in sub.results), \
        [(r.exercise, r.status, r.feedback[:300]) for r in sub.results]


def test_the_command_line_says_what_container_mode_leaves_open(no_bwrap, tmp_path):
    import subprocess
    import sys
    path = _submission(tmp_path)
    ran = subprocess.run([sys.executable, "-m", "txlearn.cli", "grade", str(path)],
                         capture_output=True, text=True, cwd=build.ROOT)
    assert ran.returncode == 2 and "--container" in ran.stderr, ran.stderr
    ran = subprocess.run([sys.executable, "-m", "txlearn.cli", "grade", "--container", str(path)],
                         capture_output=True, text=True, cwd=build.ROOT)
    assert ran.returncode == 0, ran.stderr
    assert "container mode" in ran.stderr and "docs/containers.md" in ran.stderr, ran.stderr
    assert "4/4" in ran.stdout, ran.stdout


def test_as_root_the_runner_takes_a_uid_where_one_can_run_python_else_drops_capabilities(
        monkeypatch):
    import tempfile

    from txlearn.course.grading import installation

    base = Path(tempfile.mkdtemp())     # in /tmp (1777): its own mode decides, not pytest's
    try:
        # a Python installation under a folder others may not enter (/root/.pyenv) cannot run
        # as a leased uid; one whose folders others may pass and read can
        shut = base / "root"
        (shut / "py" / "bin").mkdir(parents=True)
        (shut / "py" / "bin" / "python").write_text("")
        for path in (base, shut / "py", shut / "py" / "bin", shut / "py" / "bin" / "python"):
            path.chmod(0o755)
        shut.chmod(0o700)
        layout = (str(shut / "py" / "bin" / "python"), (str(shut / "py"),),
                  (str(shut / "py"),), ())
        monkeypatch.setattr(sandbox, "python_layout", lambda: layout)
        assert not sandbox.others_can_run()
        shut.chmod(0o755)
        assert sandbox.others_can_run()
        (shut / "py" / "bin" / "python").chmod(0o711)     # others may pass, not read
        assert not sandbox.others_can_run()
    finally:
        shutil.rmtree(base)
    limits = {"memory_mb": 512, "cpu_seconds": 5, "file_mb": 4}
    monkeypatch.setattr(sandbox, "import_mb", lambda preload: 0)
    monkeypatch.setattr(installation, "python_layout", lambda: layout)
    with_uid = sandbox.runner_config({}, mode="container", limits=limits, uid=61000,
                                     view_dir="/v")
    without = sandbox.runner_config({}, mode="container", limits=limits, uid=None, view_dir="/v")
    assert with_uid["uid"] == 61000 and not with_uid["drop_capabilities"]
    assert without["uid"] is None and without["drop_capabilities"] == (os.geteuid() == 0)
    assert "drop_capabilities" not in sandbox.runner_config({}, mode="bwrap", limits=limits,
                                                            uid=None, view_dir="/v")
