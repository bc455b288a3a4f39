"""The students' environment on a hub: the single-user image recipe (Dockerfile) and Binder's
(binder/postBuild) install the course by running tools/install.sh, the script `make lab` runs,
and install nothing of their own; the learner's answers live outside the course's checkout. No
image can be built on these machines (no registry is reachable), so the recipes are read here;
tools/install.sh itself is tested in tests/test_install.py."""

import os
import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
POSTBUILD = ROOT / "binder" / "postBuild"
HOOK = ROOT / "tools" / "hub" / "txlearn-work.sh"
INSTALLERS = re.compile(r"\b(pip3?|conda|mamba|micromamba|uv|apt-get|apt)\b\s+install\b|"
                        r"-m\s+pip\b")


def _commands(text: str) -> list[str]:
    """The shell commands of a recipe: continuation lines joined, comments dropped, each RUN's
    ``&&`` chain split."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = re.sub(r"^RUN\s+", "", line)
        out += [part.strip() for part in line.split("&&")]
    return out


def test_make_lab_runs_tools_install_sh():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nvenv-lab:"):].split("\n\n")[0]
    assert "sh tools/install.sh $(VENV)" in recipe, recipe


def test_the_hub_image_installs_by_that_script_and_nothing_else():
    commands = _commands(DOCKERFILE.read_text())
    installs = [c for c in commands if "tools/install.sh" in c]
    assert installs == ["sh /opt/txlearn/tools/install.sh /opt/txlearn/.venv"], commands
    assert "COPY --chown=${NB_UID}:${NB_GID} . /opt/txlearn" in commands
    # no package installed around the script (a kernel spec is not a package)
    assert [c for c in commands if INSTALLERS.search(c)] == [], commands
    kernel = [c for c in commands if "ipykernel install" in c]
    assert kernel and kernel[0].startswith("/opt/txlearn/.venv/bin/python -m ipykernel install")


def test_binder_installs_by_that_script_and_nothing_else():
    assert os.access(POSTBUILD, os.X_OK)
    commands = _commands(POSTBUILD.read_text())
    assert "sh tools/install.sh .venv" in commands, commands
    assert [c for c in commands if INSTALLERS.search(c)] == [], commands
    assert ".venv/bin/txlearn update-work work" in commands
    others = [p for p in (ROOT / "binder").iterdir() if p.name != "postBuild"]
    assert others == [], f"repo2docker would install from {others} besides the script"


def test_answers_live_outside_the_image_checkout(tmp_path):
    dockerfile = DOCKERFILE.read_text()
    assert "COPY tools/hub/txlearn-work.sh /usr/local/bin/before-notebook.d/" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "work" in ignored     # no learner's answers baked in
    # the hook updates ~/work (the hub's persistent home), never a folder of /opt/txlearn: run
    # it with a stand-in txlearn that records its arguments
    fake = tmp_path / "opt"
    hook = HOOK.read_text().replace("/opt/txlearn/.venv/bin/txlearn", str(fake / "txlearn"))
    fake.mkdir()
    (fake / "txlearn").write_text("#!/bin/sh\necho \"$@\" > \"$LOG\"\n")
    (fake / "txlearn").chmod(0o755)
    env = {"HOME": str(tmp_path / "home"), "LOG": str(tmp_path / "log"), "PATH": "/usr/bin:/bin"}
    subprocess.run(["sh", "-c", hook], env=env, check=True)
    assert shlex.split((tmp_path / "log").read_text()) == ["update-work",
                                                          str(tmp_path / "home" / "work")]
