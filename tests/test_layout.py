"""The package layout: docs/architecture.md's tree lists every file, every public name has a
docstring and the API reference builds from them; imports run downhill through the layers, no
private name crosses a module boundary, no file is over 600 lines and every file opens with a
docstring; set 09's first-release import paths (two shims) still work in a learner's kernel;
``python -m txlearn`` runs the command."""

import ast
import dataclasses
import html
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def _tree():
    """The code blocks of docs/architecture.md that draw the tree (each opens with txlearn/)."""
    blocks = re.findall(r"^```\n(.*?)^```", ARCHITECTURE, flags=re.S | re.M)
    return "\n".join(b for b in blocks if b.startswith("txlearn/"))


# ---- every public name has a docstring ---------------------------------------------------------

def _check_stems():
    from txlearn.checks.registry import exercise_modules
    return set(exercise_modules().values())



def _public_modules():
    """Every public module of the package: no part of its dotted name starts with "_"; of
    ``txlearn.checks`` only its face (the check modules of the sets and the helpers they share
    are the checks' insides), and not the command (``txlearn --help`` documents it)."""
    names = set()
    for path in (ROOT / "txlearn").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(n for n in names if not any(part.startswith("_") for part in n.split("."))
                  and not n.startswith("txlearn.checks.") and n != "txlearn.cli")


def _own_docstring(obj):
    """The docstring written for `obj` itself: not one a class inherits, not the signature a
    dataclass writes when it has none."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        if doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return ""
        return doc or ""
    if inspect.isroutine(obj) or inspect.ismodule(obj) or isinstance(obj, property):
        return obj.__doc__ or ""
    return None                                  # a value: documented where it is assigned


def _undocumented(module):
    """Names of `module`'s public interface (its __all__, else the functions and classes it
    defines) that are functions or classes without a docstring of their own. Values (constants,
    instances) cannot carry one: the module's docstring or a comment at the assignment says
    what they hold."""
    mod = importlib.import_module(module)
    public = getattr(mod, "__all__", None)
    if public is None:
        public = [n for n, o in vars(mod).items() if not n.startswith("_") and
                  (inspect.isclass(o) or inspect.isfunction(o)) and o.__module__ == module]
    return [name for name in public if _own_docstring(getattr(mod, name)) == ""]


@pytest.mark.parametrize("module", _public_modules())
def test_every_public_name_has_a_docstring(module):
    mod = importlib.import_module(module)
    assert (mod.__doc__ or "").strip(), f"{module} has no module docstring"
    missing = _undocumented(module)
    assert not missing, (f"{module}: public names without a docstring (the API reference is "
                         f"generated from them): {missing}")


def test_the_docstring_test_can_fail(tmp_path, monkeypatch):
    # a probe module: a function and a dataclass without docstrings, one of each with a
    # docstring, and a constant (values carry no docstring of their own)
    (tmp_path / "txlearn_probe_docs.py").write_text(textwrap.dedent('''
        """A probe."""
        import dataclasses
        __all__ = ["bare", "told", "Bare", "Told", "LIMIT"]
        def bare(): pass
        def told():
            """Told."""
        @dataclasses.dataclass
        class Bare:
            x: int
        @dataclasses.dataclass
        class Told:
            """Told."""
            x: int
        LIMIT = 3
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _undocumented("txlearn_probe_docs") == ["bare", "Bare"]


# ---- the API reference builds ------------------------------------------------------------------

@pytest.fixture(scope="session")
def reference_book(tmp_path_factory):
    """The reference written once, as the book holds it: in reference/ beside a contents page."""
    from txlearn.course import reference

    book = tmp_path_factory.mktemp("book")
    (book / "index.html").write_text("<html><body>contents</body></html>")
    return book, reference.write_reference(book / "reference")


def _public_names(module):
    mod = importlib.import_module(module)
    public = getattr(mod, "__all__", None)
    if public is None:
        public = [n for n, o in vars(mod).items() if not n.startswith("_") and
                  (inspect.isclass(o) or inspect.isfunction(o)) and o.__module__ == module]
    return public


def test_the_reference_has_one_page_per_public_module(reference_book):
    _, pages = reference_book
    expected = [Path(*m.split(".")).with_suffix(".html") for m in _public_modules()]
    assert pages == expected
    assert Path("txlearn/attention.html") in pages and Path("txlearn/checks.html") in pages
    assert Path("txlearn/checks/softmax.html") not in pages    # a set's checks: not an API
    assert Path("txlearn/cli.html") not in pages


def test_each_reference_page_shows_its_modules_public_names_and_docstrings(reference_book):
    folder, pages = reference_book
    for module, page in zip(_public_modules(), pages):
        text = (folder / "reference" / page).read_text(encoding="utf-8")
        missing = [n for n in _public_names(module) if f'id="{n}"' not in text]
        assert not missing, f"{page}: no entry for {missing}"
        words = lambda s: " ".join(re.sub(r"\W+", " ", s).split())   # noqa: E731
        # the docstring's opening words, up to its first markup (a ``name`` or :role:)
        lead = re.split(r"[`:*]", importlib.import_module(module).__doc__.strip())[0]
        first = words(lead).split()[:4]
        assert " ".join(first) in words(html.unescape(re.sub(r"<[^>]+>", " ", text))), page
    attention = (folder / "reference" / "txlearn" / "attention.html").read_text(encoding="utf-8")
    assert "scaled_dot_product_attention" in attention and "return_weights" in attention


def test_the_reference_loads_nothing_from_outside_and_links_the_contents(reference_book):
    from txlearn.course import book_links

    folder, pages = reference_book
    book_links.check_links(folder)          # every load relative and inside; links resolve
    assert (folder / "reference" / "search.js").stat().st_size > 10_000
    for page in (Path("txlearn.html"), Path("txlearn/course/grading/sandbox.html")):
        text = (folder / "reference" / page).read_text(encoding="utf-8")
        up = "../" * len(page.parts)
        assert f'href="{up}index.html"' in text, page       # back to the book's contents
        assert "cdn" not in text.lower() and "<script src=\"http" not in text


def test_a_module_that_cannot_be_imported_stops_the_reference_by_name(tmp_path):
    from txlearn.course import reference

    with pytest.raises(reference.ReferenceBuildError,
                       match="cannot import txlearn.no_such_module: ModuleNotFoundError"):
        reference.write_reference(tmp_path, ["txlearn.softmax", "txlearn.no_such_module"])


def test_the_tree_lists_every_file_of_the_package():
    tree = _tree()
    for path in sorted((ROOT / "txlearn").rglob("*.py")):
        rel = path.relative_to(ROOT / "txlearn")
        if path.name == "__init__.py" or (rel.parts[0] == "checks" and len(rel.parts) == 2 and
                                          path.stem in _check_stems()):
            continue   # the check modules: one per exercise set, named like the lesson's module
        assert re.search(rf"(^|[\s,]){re.escape(path.name)}\b", tree), f"{rel} is not in the tree"
    for folder in ("models/", "training/", "capstone/", "course/", "grading/", "checks/"):
        assert folder in tree


# ---- the layers: imports run downhill ----------------------------------------------------------

COMPONENTS = {"softmax", "masks", "attention", "heads", "positional", "ffn", "norms", "layer",
              "flash_attention", "sliding_window", "counting", "measuring", "recurrent", "sampling", "tokens",
              "plotting"}


def _layer(module: str):
    """The layer of a txlearn module (docs/architecture.md, "The layers"), or None for a module the rule does
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
