"""The package layout: CONTRIBUTING's tree and interface table match the code; the old import
paths of moved modules (used by learners' notebooks, instructors' scripts and hidden-case files)
still work; ``python -m txlearn`` runs the command."""

import importlib
import re
import subprocess
import sys
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


def test_the_table_covers_every_module():
    modules = {m for m, _ in ROWS}
    package = ROOT / "txlearn"
    on_disk = {p.relative_to(package).with_suffix("").as_posix().replace("/", ".")
               for p in package.rglob("*.py")
               if not p.name.startswith("_") and "checks" not in p.parts[-2:-1]}
    on_disk -= {"cli"}                             # the command itself: README and --help
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
        if rel.parts[0] == "checks" or path.name == "__init__.py":
            continue
        assert re.search(rf"(^|[\s,]){re.escape(path.name)}\b", tree), f"{rel} is not in the tree"
    for folder in ("capstone/", "course/", "checks/"):
        assert folder in tree


OLD_TRAINING_NAMES = ["UserError", "TrainConfig", "CharTransformer", "learning_rate", "time_budget",
                      "evaluate", "TrainResult", "train", "save_checkpoint", "load_checkpoint",
                      "generate", "sample_text", "add_train_parser", "add_sample_parser"]


def test_old_import_paths_still_work():
    # what learners' notebooks and instructors' scripts wrote before the move
    import txlearn.training as training
    for name in OLD_TRAINING_NAMES:
        assert hasattr(training, name), name
    from txlearn.training import CharTransformer, train  # noqa: F401
    from txlearn.capstone.model import CharTransformer as moved
    assert CharTransformer is moved
    from txlearn.data import load_corpus
    from txlearn.capstone import data
    assert load_corpus is data.load_corpus
    import txlearn.data
    assert txlearn.data is data                      # the same module object
    from txlearn.pretrained import load_encoder, model_dir  # noqa: F401
    from txlearn.build import build, drift  # noqa: F401
    from txlearn.grading import grade  # noqa: F401
    import txlearn
    assert txlearn.training.train is train and txlearn.build.build is build


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
