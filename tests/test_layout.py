"""The package layout: CONTRIBUTING's tree and interface table match the code; imports run
downhill through the layers, no private name crosses a module boundary, no file is over 600
lines and every file opens with a docstring; set 09's first-release import paths (two shims)
still work in a learner's kernel; ``python -m txlearn`` runs the command."""

import ast
import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")


def _table_rows():
    start = CONTRIBUTING.index("| module | public names")
    rows = []
    for line in CONTRIBUTING[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        module, names = [c.strip() for c in line.strip("|").split("|", 1)]
        rows.append((module, names))
    return rows


# `name(`, `Class.method(` or a bare `name` between backticks; `W_Q (shape)` and `arg=` are not names
_NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)(?:\(|`)")


def _names(cell):
    return sorted(set(_NAME.findall(cell)))


ROWS = _table_rows()


def _has_face(init):
    """A package whose __init__ declares __all__ is a module of its own (``checks``,
    ``course.grading``): its face is in the table."""
    return any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
               for n in ast.parse(init.read_text(encoding="utf-8")).body)


def test_the_table_covers_every_module():
    modules = {m for m, _ in ROWS}
    package = ROOT / "txlearn"
    on_disk = {p.relative_to(package).with_suffix("").as_posix().replace("/", ".")
               for p in package.rglob("*.py")
               if not p.name.startswith("_") and "checks" not in p.parts[-2:-1]}
    on_disk |= {p.parent.relative_to(package).as_posix().replace("/", ".")
                for p in package.rglob("__init__.py") if p.parent != package and _has_face(p)}
    on_disk -= {"cli"}                             # the command itself: README and --help
    on_disk -= {"capstone.data", "capstone.assets"}   # re-export shims (their test is below)
    on_disk |= {"checks"}
    assert on_disk - modules == set(), f"modules missing from CONTRIBUTING's table: {on_disk - modules}"
    assert modules - on_disk == set(), f"table rows without a module: {modules - on_disk}"


@pytest.mark.parametrize("module,cell", ROWS, ids=[m for m, _ in ROWS])
def test_every_name_in_the_table_imports(module, cell):
    mod = importlib.import_module(f"txlearn.{module}")
    names = _names(cell)
    assert names, f"no names parsed in the row of {module}"
    for name in names:
        obj = mod
        for part in name.split("."):
            assert hasattr(obj, part), f"txlearn.{module} has no {name} (CONTRIBUTING's table)"
            obj = getattr(obj, part)
    public = getattr(mod, "__all__", None)
    if public is not None:   # and everything the module exports is in the table
        missing = set(public) - {n.split(".")[0] for n in names}
        assert not missing, f"txlearn.{module} exports {sorted(missing)}, not in CONTRIBUTING's table"


def test_the_tree_lists_every_file_of_the_package():
    start = CONTRIBUTING.index("```\ntxlearn/")
    tree = CONTRIBUTING[start:CONTRIBUTING.index("```", start + 3)]
    for path in sorted((ROOT / "txlearn").rglob("*.py")):
        rel = path.relative_to(ROOT / "txlearn")
        if path.name == "__init__.py" or (rel.parts[0] == "checks" and len(rel.parts) == 2 and
                                          path.stem in _check_stems()):
            continue   # the check modules: one per exercise set, named like the lesson's module
        assert re.search(rf"(^|[\s,]){re.escape(path.name)}\b", tree), f"{rel} is not in the tree"
    for folder in ("models/", "training/", "capstone/", "course/", "grading/", "checks/"):
        assert folder in tree


def _check_stems():
    from txlearn.checks.registry import exercise_modules
    return set(exercise_modules().values())


# ---- the layers: imports run downhill ----------------------------------------------------------

COMPONENTS = {"softmax", "masks", "attention", "heads", "positional", "ffn", "norms", "layer",
              "flash_attention", "sliding_window", "counting", "measuring", "recurrent", "sampling", "tokens",
              "plotting"}


def _layer(module: str):
    """The layer of a txlearn module (CONTRIBUTING, "Layers"), or None for a module the rule does
    not place. Within a layer imports go either way; learner_calls sits below the checks."""
    parts = module.split(".")[1:]
    if not parts:
        return None                     # the package itself: lazy access only (``__getattr__``)
    top = parts[0]
    if top == "precision":
        return 0
    if top in COMPONENTS:
        return 1
    if top == "models":
        return 2
    if top in ("training", "capstone"):  # capstone/: the set-09 shims of training and models
        return 3
    if top == "learner_calls":
        return 4
    if top == "checks":
        return 4.5
    if top == "course":
        return 5
    if top in ("cli", "__main__"):
        return 6
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    return _imports_of(path.read_text(encoding="utf-8"), _module_name(path),
                       path.name == "__init__.py")


def _is_module(name: str) -> bool:
    where = ROOT / Path(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _imports_of(source: str, module: str, is_package: bool):
    """(imported txlearn module, line) for every import in ``source`` (module ``module``),
    inside functions too; ``from txlearn.a import b`` counts as txlearn.a.b when that is a
    module."""
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("txlearn"):
                    yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("txlearn"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield (sub if _is_module(sub) else base), node.lineno


PACKAGE_FILES = sorted((ROOT / "txlearn").rglob("*.py"))


def _upward_imports():
    bad = []
    for path in PACKAGE_FILES:
        module = _module_name(path)
        mine = _layer(module)
        for imported, line in _imports(path):
            theirs = _layer(imported)
            if imported == "txlearn":
                continue
            if mine is None or theirs is None:
                bad.append(f"{module}:{line} imports {imported} (no layer for "
                           f"{module if mine is None else imported})")
            elif theirs > mine:
                bad.append(f"{module}:{line} (layer {mine}) imports {imported} (layer {theirs})")
    return bad


def test_imports_run_downhill_through_the_layers():
    bad = _upward_imports()
    assert not bad, "imports up the layers:\n" + "\n".join(bad)


def test_the_layer_test_can_fail():
    # the scan sees an import inside a function, here a check importing the grader's wire format
    source = "import numpy\n\ndef f():\n    from txlearn.course.grading import protocol\n"
    found = list(_imports_of(source, "txlearn.checks.softmax", False))
    assert found == [("txlearn.course.grading.protocol", 4)]
    assert _layer("txlearn.course.grading.protocol") > _layer("txlearn.checks.softmax")
    assert _layer("txlearn.learner_calls") < _layer("txlearn.checks")
    assert _layer("txlearn.precision") < _layer("txlearn.softmax") < _layer("txlearn.models.llama")


def test_no_private_name_crosses_a_module_boundary():
    bad = []
    for path in PACKAGE_FILES:
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("txlearn"):
                names = [a.name for a in node.names
                         if a.name.startswith("_") and not a.name.endswith("__")]
                hidden = [p for p in (node.module or "").split(".") if p.startswith("_")]
                if names or hidden:
                    bad.append(f"{module}:{node.lineno} imports {', '.join(names or hidden)} "
                               f"from {node.module}")
            elif isinstance(node, ast.Import):
                bad += [f"{module}:{node.lineno} imports {a.name}" for a in node.names
                        if a.name.startswith("txlearn") and
                        any(p.startswith("_") for p in a.name.split("."))]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


MAX_LINES = 600


def test_no_file_of_the_package_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE_FILES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_every_file_opens_with_a_docstring_naming_its_job():
    missing = [str(p.relative_to(ROOT)) for p in PACKAGE_FILES
               if not (ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "").strip()]
    assert not missing, f"files without an opening docstring: {missing}"



def test_the_models_know_nothing_of_training():
    # e.g. CharTransformer takes its sizes as arguments, not a TrainConfig
    for path in sorted((ROOT / "txlearn" / "models").glob("*.py")):
        above = [t for t, _ in _imports(path) if t != "txlearn" and _layer(t) > _layer("txlearn.models")]
        assert not above, f"{path.name} imports {above}"


def test_set_09_answers_of_the_first_release_still_import_in_a_kernel(tmp_path):
    # a learner's saved set-09 answer cell, run as their kernel runs it: a fresh interpreter in the
    # folder of their notebook, with the installed package
    answer = textwrap.dedent("""
        from txlearn.capstone.assets import model_dir, tokenize
        import txlearn.capstone.assets as old_files, txlearn.models.minilm_files as new_files
        from txlearn.capstone.data import CharVocab, bigram_nats, load_corpus, split_by_position
        import txlearn.capstone.data as old, txlearn.training.data as new
        assert old.load_corpus is new.load_corpus and old.__all__ == new.__all__
        assert old_files.tokenize is new_files.tokenize and old_files.__all__ == new_files.__all__
        vocab = CharVocab.from_text("hello")
        print(len(vocab), (model_dir() / "tokenizer.json").is_file(),
              tuple(tokenize(["a cat"])["input_ids"].shape))
    """)
    out = subprocess.run([sys.executable, "-c", answer], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "True", "(1,", "4)"]   # h, e, l, o; [CLS] a cat [SEP]


def test_set_09_may_import_the_new_modules_and_the_shims():
    from txlearn.course.build import find_source, read_source, set_info
    source = find_source("09_capstone")
    imports = set(set_info(read_source(source), source.stem, source.name).imports)
    assert {"txlearn.training.data", "txlearn.models.minilm_files", "txlearn.capstone.data",
            "txlearn.capstone.assets"} <= imports


def test_hidden_case_and_check_cell_imports_still_work():
    # a check cell in a learner's existing copy, and an instructor's hidden-case file
    from txlearn.checks import check  # noqa: F401
    from txlearn.checks import CheckFailure, call, expect_close  # noqa: F401


def test_python_dash_m_txlearn_runs_the_command():
    out = subprocess.run([sys.executable, "-m", "txlearn", "build", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "every generated notebook matches its source" in out.stdout
    helped = subprocess.run([sys.executable, "-m", "txlearn", "sample", "--help"], cwd=ROOT,
                            capture_output=True, text=True)
    assert helped.returncode == 0 and "--top-p" in helped.stdout
