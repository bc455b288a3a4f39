"""The grader's fork servers (issue 24): runners forked from one sandbox per worker and set keep
every submission from the next one, and grade exactly as runners started one by one.

The attacker is a copy of lesson 01's exercise notebook whose answer cell leaves what it can in
the sandbox for whoever comes next (files in every writable folder, System V and POSIX IPC
objects, a kernel key, a lower priority or a pinned CPU for the server, a ptrace of it); the
next submission of the same server (one job: they follow each other) looks for all of it. Run as
root (CI is), so the runners have uids of their own; the ordinary user's case is in
tests/test_grading_attacks.py (``..._as_an_ordinary_user``), which grades through the servers.
What a runner writes into the kernel's counters (pids, inode numbers, access times, extended
attributes) is read back by a reader graded before and one graded after it, as root and as an
ordinary user (each runner has a pid namespace and tmpfs folders of its own).
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from txlearn.course import grading
from txlearn.course.grading import forkserver, installation, runner, runner_pool, sandbox
from txlearn.course.grading.sets import load_set
from txlearn.course import build

from tests.test_grading_attacks import LIMITS, NO_SHIFT, SOLUTION, STUB, _notebook, _seen

# the system call numbers, from the kernel's tables (not from the filter under test)
NUMBERS = {"x86_64": {"msgget": 68, "semget": 64, "mq_open": 240, "add_key": 248, "ptrace": 101},
           "aarch64": {"msgget": 186, "semget": 190, "mq_open": 180, "add_key": 217,
                       "ptrace": 117}}[platform.machine().lower()]

LEAVE = f'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
_R = {{}}
for folder in ("/home/learner", "/tmp", "/dev/shm"):
    try:
        os.makedirs(folder + "/left/deep", exist_ok=True)
        open(folder + "/left/deep/note", "w").write("from the one before")
        os.chmod(folder + "/left/deep", 0o500)
        os.chmod(folder + "/left", 0o500)
        _R[folder] = "left"
    except OSError as err:
        _R[folder] = type(err).__name__
def _call(name, *args):
    r = libc.syscall({NUMBERS["msgget"]} if name == "msgget" else
                     {NUMBERS["semget"]} if name == "semget" else
                     {NUMBERS["mq_open"]} if name == "mq_open" else
                     {NUMBERS["add_key"]} if name == "add_key" else
                     {NUMBERS["ptrace"]}, *args)
    return [r, ctypes.get_errno()]
_R["msgget"] = _call("msgget", 0x7431, 0o1666)
_R["semget"] = _call("semget", 0x7431, 1, 0o1666)
_R["mq_open"] = _call("mq_open", b"txlearn-left", 0o102, 0o666, None)
_R["add_key"] = _call("add_key", b"user", b"txlearn-left", b"x", 1, -3)
_R["ptrace"] = _call("ptrace", 16, os.getppid(), None, None)
_R["draw"] = __import__("numpy").random.random()
_R["ppid"] = os.getppid()
for what, change in (("nice", lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)),
                     ("pin", lambda: os.sched_setaffinity(os.getppid(), {{0}}))):
    try:
        change()
        _R[what] = "changed"
    except OSError as err:
        _R[what] = type(err).__name__
def softmax(x, axis=-1):
    raise ValueError("LEFT " + json.dumps(_R))
'''

LOOK = '''
import json, os, stat
def _sockets():
    out = []
    for fd in range(4096):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                out.append(fd)
        except OSError:
            pass
    return out
_R = {"found": {f: sorted(os.listdir(f)) for f in ("/home/learner", "/tmp", "/dev/shm")},
      "nice": os.getpriority(os.PRIO_PROCESS, 0), "cpus": len(os.sched_getaffinity(0)),
      "sockets": _sockets(), "draw": __import__("numpy").random.random()}
def softmax(x, axis=-1):
    raise ValueError("LOOK " + json.dumps(_R))
'''


def _tmp_tops():
    """What the sandbox's /tmp holds of its own: the first folder of each bound root of the
    Python installation under /tmp (a clone under /tmp: its venv); nothing otherwise."""
    return sorted({Path(r).relative_to("/tmp").parts[0] for r in sandbox.python_layout()[1]
                   if r.startswith("/tmp/")})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forkserver")
    os.chmod(tmp, 0o755)
    paths = [_notebook(SOLUTION, tmp / "a_correct" / "01_softmax.ipynb"),
             _notebook(SOLUTION, tmp / "b_leaver" / "01_softmax.ipynb",
                       answers={"stable_softmax": LEAVE}),
             _notebook(SOLUTION, tmp / "c_looker" / "01_softmax.ipynb",
                       answers={"stable_softmax": LOOK}),
             _notebook(SOLUTION, tmp / "d_wrong" / "01_softmax.ipynb",
                       answers={"stable_softmax": NO_SHIFT})]
    return _grade_counting(paths)


# the tests' limits with room for a loaded machine: no notebook here runs past a limit, and
# one whose cell timed out (3 s of a starved runner) was graded again in a new runner without
# that cell, so the looker's report or the runners' count depended on the load
ROOMY = dict(LIMITS, cell_seconds=60, call_seconds=30)


def _grade_counting(paths):
    """Grade ``paths`` in one job, counting the fork servers started and the runners forked."""
    started, spawned = [], []
    real_init, real_spawn = runner_pool.ForkServer.__init__, runner_pool.ForkServer.spawn

    def init(self, **kwargs):
        started.append(kwargs["preloaded"])
        real_init(self, **kwargs)

    def spawn(self, *args):
        spawned.append(self)
        return real_spawn(self, *args)

    mp = pytest.MonkeyPatch()
    mp.setattr(runner_pool.ForkServer, "__init__", init)
    mp.setattr(runner_pool.ForkServer, "spawn", spawn)
    grader = {"nice": os.getpriority(os.PRIO_PROCESS, 0), "cpus": len(os.sched_getaffinity(0))}
    try:
        subs = grading.grade(paths, jobs=1, limits=ROOMY)
    finally:
        mp.undo()
    return {"subs": subs, "started": started, "spawned": spawned, "grader": grader,
            "by": {s.student: {r.exercise: r for r in s.results} for s in subs}}


def test_one_server_forks_every_runner_of_a_set_and_grades_as_before(graded):
    assert runner_pool.supported() == (True, ""), runner_pool.supported()
    assert graded["started"] == [("numpy",)]       # set 01's setup imports NumPy only
    assert len(graded["spawned"]) == 4 and len(set(map(id, graded["spawned"]))) == 1
    points = {s.student: (s.points, s.error) for s in graded["subs"]}
    assert points["a_correct"] == (4, "") and points["d_wrong"] == (3, ""), points
    assert points["b_leaver"][0] == points["c_looker"][0] == 3, points


def test_what_a_submission_tries_to_leave_behind_is_refused(graded):
    left = _seen(graded["by"]["b_leaver"]["stable_softmax"], "LEFT")
    assert left["/home/learner"] == left["/tmp"] == left["/dev/shm"] == "left", left
    eperm = 1
    for call in ("msgget", "semget", "mq_open", "add_key", "ptrace"):
        assert left[call] == [-1, eperm], (call, left[call])
    # the runner is pid 2 of a pid namespace of its own, whose init (pid 1) is its parent: it
    # cannot name its server, so the priority and CPUs it changed were not the server's (the
    # next one's are checked below)
    assert left["ppid"] == 1, left


def test_the_next_submission_of_the_same_server_finds_nothing(graded):
    seen = _seen(graded["by"]["c_looker"]["stable_softmax"], "LOOK")
    assert seen["found"] == {"/home/learner": [], "/tmp": _tmp_tops(), "/dev/shm": []}, seen
    # the server's, as the grader's were when it started it (not a leaver's nice 19 or one CPU)
    assert {k: seen[k] for k in ("nice", "cpus")} == graded["grader"], (seen, graded["grader"])
    assert seen["sockets"] == [], seen     # the server's control socket is closed in the child
    # NumPy's global stream is drawn afresh in each child, as in a process of its own
    assert seen["draw"] != _seen(graded["by"]["b_leaver"]["stable_softmax"], "LEFT")["draw"]


def test_a_set_that_uses_torch_is_served_with_torch_imported():
    cs = load_set(build.find_source("03_heads"))
    assert runner_pool.preload(cs) == ("numpy", "torch", "torch.nn", "torch.nn.functional")
    assert runner_pool.preload(load_set(build.find_source("01_softmax"))) == ("numpy",)


def test_a_server_that_was_changed_notices(tmp_path):
    # the server compares its priority, CPUs and limits with those at its start (a runner of the
    # same uid, the grader not being root, could change them for the next one) and stops
    code = ("import os\nfrom txlearn.course.grading import forkserver as f\nb = f._state()\n"
            "os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 1)\n"
            "print(f._state() != b, f._state() == f._state())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_a_server_whose_scheduling_was_changed_notices():
    # as an ordinary user a runner could make its server SCHED_IDLE (sched_setscheduler on its
    # ppid) or give it the idle I/O class: every later runner inherited it and, on a loaded
    # machine, ran out of its wall-clock limits; the priority alone was compared
    code = ("import ctypes, os\nfrom txlearn.course.grading import forkserver as f\n"
            "libc = ctypes.CDLL(None)\nb = f._state()\n"
            "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "idle = f._state()\nprint(idle != b, idle == f._state())\n"
            "b = f._state()\nprint(libc.syscall(%d, 1, 0, 3 << 13), f._state() != b)\n"
            % {"x86_64": 251, "aarch64": 30}[platform.machine().lower()])  # ioprio_set
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["True", "True", "0", "True"], (done.stdout, done.stderr)


def test_every_tmpfs_but_the_sized_folders_is_read_only(tmp_path):
    # as an ordinary user bubblewrap's tmpfs belongs to the runner: the empty ones laid over the
    # site-packages folders (to hide the packages a set does not use) were writable, unsized,
    # never emptied, and on every later runner's sys.path
    from txlearn.course.grading import sandbox
    ok, bwrap = sandbox.available()
    assert ok, bwrap
    argv = sandbox.bwrap_argv(bwrap, view_dir=str(tmp_path), files=[], limits=LIMITS,
                              tail=["true"], packages=installation.package_entries(("numpy",)))
    sized = set(sandbox.writable_mb(LIMITS))
    tmpfs = [(i, argv[i + 1]) for i, a in enumerate(argv) if a == "--tmpfs"]
    assert len(tmpfs) > len(sized) + 1, argv
    for i, path in tmpfs:
        if path not in sized:
            assert ["--remount-ro", path] in [argv[j:j + 2] for j in range(i, len(argv))], path


def test_the_filter_refuses_io_uring():
    # io_uring's operations are system calls the kernel makes past the filter: a runner made
    # the socket that socket() may not (IORING_OP_SOCKET, Linux 5.19) with io_uring_setup
    # and io_uring_enter (425, 426 on x86-64 and aarch64 alike)
    code = ("import ctypes, socket\nfrom txlearn.course.grading import forkserver, seccomp\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "forkserver._install_filter(libc, seccomp.program())\n"
            "params = ctypes.create_string_buffer(120)\n"
            "print(libc.syscall(425, 4, params), ctypes.get_errno())\n"
            "print(libc.syscall(427, 0, 0, None, 0), ctypes.get_errno())\n"
            "try:\n    socket.socket(socket.AF_UNIX)\nexcept PermissionError:\n"
            "    print('refused')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["-1", "1", "-1", "1", "refused"], (done.stdout, done.stderr)


def test_runners_started_one_by_one_grade_alike(tmp_path, monkeypatch):
    os.chmod(tmp_path, 0o755)
    paths = [_notebook(SOLUTION, tmp_path / "correct" / "01_softmax.ipynb"),
             _notebook(SOLUTION, tmp_path / "wrong" / "01_softmax.ipynb",
                       answers={"stable_softmax": NO_SHIFT})]
    forked = grading.grade(paths, jobs=2, limits=LIMITS)
    monkeypatch.setattr(runner_pool, "supported", lambda: (False, "switched off by the test"))
    alone = grading.grade(paths, jobs=2, limits=LIMITS)
    rows = [[(r.exercise, r.status, r.feedback) for r in s.results] for s in forked]
    assert rows == [[(r.exercise, r.status, r.feedback) for r in s.results] for s in alone]
    assert [s.points for s in forked] == [4, 3]


def test_a_python_installed_under_tmp_is_put_back_in_each_runners_tmp(tmp_path, monkeypatch):
    # a clone under /tmp binds its venv at /tmp/<clone>/.venv inside the sandbox: each runner's
    # new /tmp holds that mount point again (cloned, read-only) in new folders of mode 0755,
    # and nothing else of the one before
    clone = Path(tempfile.mkdtemp(prefix="clone-", dir="/tmp"))
    venv = clone / ".venv"
    try:
        venv.mkdir()
        (venv / "marker.txt").write_text("seen")
        os.chmod(clone, 0o755)
        exe, roots, path, masks = sandbox.python_layout()
        monkeypatch.setattr(sandbox, "python_layout",
                            lambda: (exe, roots + (str(venv),), path, masks))
        leave = (f"import os\nfor step in (lambda: open('/tmp/left', 'w'),\n"
                 f"             lambda: open('{clone}/left', 'w'),\n"
                 f"             lambda: os.chmod('{clone}', 0)):\n"
                 f"    try:\n        step()\n    except OSError:\n        pass\n" + STUB)
        look = (f"import json, os\n_R = [sorted(os.listdir('/tmp')), sorted(os.listdir('{clone}')),"
                f" open('{venv}/marker.txt').read()]\n"
                "def softmax(x, axis=-1):\n    raise ValueError('LOOK ' + json.dumps(_R))\n")
        os.chmod(tmp_path, 0o755)
        paths = [_notebook(SOLUTION, tmp_path / "a_leaver" / "01_softmax.ipynb",
                           answers={"stable_softmax": leave}),
                 _notebook(SOLUTION, tmp_path / "b_looker" / "01_softmax.ipynb",
                           answers={"stable_softmax": look}),
                 _notebook(SOLUTION, tmp_path / "c_correct" / "01_softmax.ipynb")]
        graded = _grade_counting(paths)
        assert len(graded["started"]) == 1 and len(graded["spawned"]) == 3, graded["started"]
        seen = _seen(graded["by"]["b_looker"]["stable_softmax"], "LOOK")
        assert seen == [_tmp_tops(), [".venv"], "seen"], seen
        assert clone.name in _tmp_tops()
        assert [s.points for s in graded["subs"]] == [3, 3, 4]
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def test_mount_points_below_the_writable_folders():
    argv = ["bwrap", "--size", "1024", "--tmpfs", "/tmp", "--ro-bind", "/tmp/c/.venv",
            "/tmp/c/.venv", "--tmpfs", "/tmp/c/.venv/lib/site", "--ro-bind", "/usr", "/usr",
            "--setenv", "HOME", "/home/learner", "--file", "7", "/home/learner/a.ipynb",
            "--chmod", "0755", "/tmp/c", "--", "/tmp/not-an-option"]
    # a --file is a copy, not a mount: only binds and tmpfs mounts are put back in a runner's
    # new folders (the clone of the first takes the second with it)
    assert runner_pool.mount_points(argv, ["/home/learner", "/tmp", "/dev/shm"]) == [
        "/tmp/c/.venv", "/tmp/c/.venv/lib/site"]
    assert forkserver._tops(["/tmp/c/.venv/lib/site", "/tmp/c/.venv"]) == ["/tmp/c/.venv"]


# ---- what one runner writes into the kernel's counters, and the next one reads -----------------

# a file every runner of the set sees (its first page: in the page cache or not), and the numbers
# of the system calls that read the page cache without timing or reading it (cachestat, io_setup)
SHARED = str(Path(__import__("numpy").__file__).with_name("__init__.pyi")) if Path(
    __import__("numpy").__file__).with_name("__init__.pyi").exists() else \
    __import__("numpy").__file__
SYSCALLS = {"x86_64": {"cachestat": 451, "io_setup": 206},
            "aarch64": {"cachestat": 451, "io_setup": 0}}[platform.machine().lower()]
KERNEL = {"x86_64": {"futex": 202, "sysinfo": 99, "statfs": 137, "syslog": 103, "bpf": 321,
                     "perf": 298},
          "aarch64": {"futex": 98, "sysinfo": 179, "statfs": 43, "syslog": 116, "bpf": 280,
                      "perf": 241}}[platform.machine().lower()]

# a default ACL that gives nobody anything (user, group, other: ---), as setfacl -d writes it
_NOTHING_ACL = "b'\\x02\\x00\\x00\\x00' + b''.join(bytes([t, 0, 0, 0]) + b'\\xff' * 4 for t in (1, 4, 32))"

WRITE = '''
import json, os, threading
_W = {{"set": [], "fill": []}}    # per folder: [files made, utime, user.* note, default ACL]
for _ in range(200):      # each thread takes a pid: the next one's pids told 7-8 bits
    _t = threading.Thread(target=lambda: None)
    _t.start()
    _t.join()
for _folder in {folders!r}:
    _made = 0
    for _i in range(64):  # each file takes an inode number of the folder's file system
        try:
            open(_folder + "/n", "w").close()
            os.unlink(_folder + "/n")
            _made += 1
        except OSError:
            pass
    _W["set"].append([_made])
    for _act in (lambda: os.utime(_folder, (4102444800, 4102444800)),
                 lambda: os.setxattr(_folder, "user.note", b"7.25,-3.5,11.0"),
                 lambda: os.setxattr(_folder, "system.posix_acl_default", {acl})):
        try:
            _act()
            _W["set"][-1].append(0)
        except OSError as _err:
            _W["set"][-1].append(_err.errno)
_libc = __import__("ctypes").CDLL(None, use_errno=True)
for _folder in {folders!r}[:3]:   # kernel memory: inodes until refused, attributes on a file
    _n, _f = 0, open(_folder + "/x", "w")
    try:
        while _n < 100_000:
            open(_folder + "/f%d" % _n, "w").close()
            _n += 1
        _W["fill"].append([_n, 0])
    except OSError as _err:
        _W["fill"].append([_n, _err.errno])
    with _f:
        for _set in (lambda: os.setxattr(_f.name, "user.a", b"x" * 65000),
                     lambda: os.setxattr(_f.name, "user.a", b"x" * 65000, follow_symlinks=False),
                     lambda: os.setxattr(_f.fileno(), "user.a", b"x" * 65000)):
            try:
                _set()
                _W["fill"][-1].append(0)
            except OSError as _err:
                _W["fill"][-1].append(_err.errno)
_W["inotify"] = [_libc.inotify_init1(0), __import__("ctypes").get_errno()]
import ctypes, fcntl, resource, signal, struct
def _errno(act):
    try:
        act()
        return 0
    except OSError as _err:
        return _err.errno
_fd, _dir = os.open({shared!r}, os.O_RDONLY), os.open(os.path.dirname({shared!r}), os.O_RDONLY)
_flock = struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 0, 0, 0)
_W["fcntl"] = [   # a lock or lease on a file every runner sees, a watch of its folder, a pipe of 1 MiB
    _errno(lambda: fcntl.flock(_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
    _errno(lambda: fcntl.fcntl(_fd, fcntl.F_SETLK, _flock)),
    _errno(lambda: fcntl.fcntl(_fd, fcntl.F_OFD_SETLK, _flock)),
    _errno(lambda: fcntl.fcntl(_fd, fcntl.F_GETLK, _flock)),
    _errno(lambda: fcntl.fcntl(_fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)),
    _errno(lambda: fcntl.fcntl(_dir, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)),
    _errno(lambda: fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 1 << 20))]
# a new pipe or pidfd takes an inode number from a counter of the whole machine, which the
# grader's pipes of the next runner show (3,000 pipes moved them by 3,000), and every thread
# takes one of the pidfs, which a pidfd shows
_W["numbered"] = [_errno(os.pipe), _errno(lambda: os.pidfd_open(os.getpid()))]
os.posix_fadvise(_fd, 0, 0, os.POSIX_FADV_DONTNEED)   # out of the page cache: the next one sees
_W["signals"] = resource.getrlimit(resource.RLIMIT_SIGPENDING)[0]
class _Sev(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_char * 48)]
_sev, _timer, _timers = _Sev(None, signal.SIGUSR1, 0), ctypes.c_void_p(), 0
while _timers < 5000 and _libc.timer_create(1, ctypes.byref(_sev), ctypes.byref(_timer)) == 0:
    _timers += 1      # each holds a queued signal of the uid's (a concurrent runner's count)
_W["timers"] = _timers
class _Phdr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("flags", ctypes.c_uint32)] + [
        (n, ctypes.c_uint64) for n in ("offset", "vaddr", "paddr", "filesz", "memsz", "align")]
class _Info(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("name", ctypes.c_char_p),
                ("phdr", ctypes.POINTER(_Phdr)), ("phnum", ctypes.c_uint16)]
_segments = []
def _each(info, size, data):
    if b"_multiarray_umath" in (info.contents.name or b""):   # what import numpy loads
        for _k in range(info.contents.phnum):
            _p = info.contents.phdr[_k]
            if _p.type == 1:   # PT_LOAD: mapped before any learner code, counted above the budget
                _lo = (info.contents.addr + _p.vaddr) & ~4095
                _segments.append((_lo, info.contents.addr + _p.vaddr + _p.memsz - _lo,
                                  (_p.flags & 4 and 1) | (_p.flags & 2) | (_p.flags & 1 and 4)))
    return 0
_libc.dl_iterate_phdr(ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Info), ctypes.c_size_t,
                                       ctypes.c_void_p)(_each), None)
# changing one (here to the protection it has) is what unmapping it to reuse its room needs
_W["remapped"] = [len(_segments), sum(_libc.mprotect(ctypes.c_void_p(lo), ctypes.c_size_t(n), prot)
                                      == 0 for lo, n, prot in _segments)]
import mmap   # a futex on a page of a file every runner sees: keyed by the file, whoever maps it
_fmap = mmap.mmap(_fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
_word = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(_fmap)))
def _futex(op):   # a shared wait (0.2 s at most) and a shared wake
    _done = _libc.syscall({futex}, _word, op, ctypes.c_uint(struct.unpack_from("I", _fmap)[0]),
                          (ctypes.c_long * 2)(0, 200_000_000), None, 0)
    return [_done, ctypes.get_errno() if _done < 0 else 0]
# (the message holds about 400 characters: one short list) a shared futex's wait and wake, the
# machine's counts (sysinfo), the host's free blocks (the grader's writes), the kernel's log, a
# BPF map, a cycle counter, pages offered for merging
_W["k"] = [_futex(0)[1], _futex(1)[0]]
for _nr, _args in (({sysinfo}, (ctypes.create_string_buffer(112),)),
                   ({statfs}, (b"/usr", ctypes.create_string_buffer(120))),
                   ({syslog}, (3, ctypes.create_string_buffer(4096), 4096)),
                   ({bpf}, (0, ctypes.create_string_buffer(72), 72)),
                   ({perf}, (ctypes.create_string_buffer(128), 0, -1, -1, 0))):
    _done = _libc.syscall(_nr, *_args)
    _W["k"].append(ctypes.get_errno() if _done < 0 else 0)
_W["k"].append(_libc.prctl(67, 1, 0, 0, 0))   # PR_SET_MEMORY_MERGE
def softmax(x, axis=-1):
    raise ValueError("WROTE " + json.dumps(_W))
'''

READ = '''
import json, os, threading, time
_R = [os.getpid()]        # then a thread's pid; per folder [future time, attributes, inodes]
_t = threading.Thread(target=lambda: None)
_t.start()
_R.append(_t.native_id)
_t.join()
for _folder in {folders!r}:
    _st = os.stat(_folder)
    _R.append([max(_st.st_atime, _st.st_mtime) > time.time() + 60, os.listxattr(_folder),
               _st.st_ino])
    try:
        open(_folder + "/probe", "w").close()
        _R[-1].append(os.stat(_folder + "/probe").st_ino)
        os.unlink(_folder + "/probe")
    except OSError as _err:
        _R[-1].append(_err.errno)
import ctypes, mmap, resource
_libc = ctypes.CDLL(None, use_errno=True)
_fd = os.open({shared!r}, os.O_RDONLY)
def _nowait():   # whether the file's first page is in the page cache, read without waiting
    try:
        return os.preadv(_fd, [bytearray(16)], 0, os.RWF_NOWAIT)
    except OSError as _err:
        return _err.errno
def _probes():
    _range, _stat, _vec = (ctypes.c_uint64 * 2)(), (ctypes.c_uint64 * 5)(), (ctypes.c_ubyte * 1)()
    _m, _anon = mmap.mmap(_fd, 4096, prot=mmap.PROT_READ), mmap.mmap(-1, 4096)
    _at = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(_anon)))
    _done = [_libc.syscall({cachestat}, _fd, _range, _stat, 0), ctypes.get_errno(),
             _libc.mincore(_at, ctypes.c_size_t(4096), _vec), ctypes.get_errno(),
             _libc.syscall({io_setup}, 16, ctypes.byref(ctypes.c_ulong(0))), ctypes.get_errno()]
    _before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    _m[0]                          # a major fault: the page was not in the page cache
    return [_nowait()] + _done + [resource.getrusage(resource.RUSAGE_SELF).ru_majflt - _before]
_R.append(_probes())
_V = {{}}   # what the fork server's loop holds: the runner is a copy of the server's memory
_f = __import__("sys")._getframe()
while _f is not None:
    if _f.f_code.co_name == "serve" and _f.f_code.co_filename.endswith("forkserver.py"):
        _V = {{k: repr(v)[:24] for k, v in _f.f_locals.items()
              if isinstance(v, (int, str, tuple)) and k != "program"}}
    _f = _f.f_back
def softmax(x, axis=-1):
    raise ValueError("SERVER " + json.dumps(_V) + " READ " + json.dumps(_R))
'''


def _writer_between_readers(folder, clone):
    """A reader, a writer and a reader of one set in ``folder`` (graded in this order, in one
    job, so by one fork server); the folders written and read: the writable ones and ``clone``,
    the folder leading to a venv under /tmp."""
    folders = [sandbox.HOME, "/tmp", "/dev/shm", str(clone)]
    os.chmod(folder, 0o755)
    write = WRITE.format(folders=folders, acl=_NOTHING_ACL, shared=SHARED, **KERNEL)
    read = READ.format(folders=folders, shared=SHARED, **SYSCALLS)
    Path(SHARED).read_bytes()   # in the page cache (the writer evicts it, if it can)
    return [_notebook(SOLUTION, folder / "a_reader" / "01_softmax.ipynb",
                      answers={"stable_softmax": read}),
            _notebook(SOLUTION, folder / "b_writer" / "01_softmax.ipynb",
                      answers={"stable_softmax": write}),
            _notebook(SOLUTION, folder / "c_reader" / "01_softmax.ipynb",
                      answers={"stable_softmax": read}),
            _notebook(SOLUTION, folder / "d_aborter" / "01_softmax.ipynb",   # signals itself
                      answers={"stable_softmax": "import os\ntry:\n    os.kill(1, 9)\n"
                                                 "except OSError:\n    pass\nos.abort()\n"}),
            _notebook(SOLUTION, folder / "e_reader" / "01_softmax.ipynb",
                      answers={"stable_softmax": read})]


def _assert_nothing_crossed(feedback, clone):
    """The writer wrote (threads, files); both readers saw the same pids, inode numbers, times
    and attributes, none of them the writer's; and the writer could set no attribute."""
    wrote = json.loads(feedback["b_writer"].split("WROTE ", 1)[1].splitlines()[0])
    first, second = (json.loads(feedback[r].split("READ ", 1)[1].splitlines()[0])
                     for r in ("a_reader", "c_reader"))
    assert [made for made, *_ in wrote["set"]][:3] == [64, 64, 64], wrote
    assert first == second, (first, second)
    assert first[0] == 2, first          # pid 2 of a pid namespace of its own
    for future, attributes, *_ in first[2:-1]:   # home, /tmp, /dev/shm, the folder to the venv
        assert not future and attributes == [], first
    enotsup = 95
    for _, _, note, acl in wrote["set"]:
        assert note == acl == enotsup, wrote


def _venv_under_tmp():
    clone = Path(tempfile.mkdtemp(prefix="clone-", dir="/tmp"))
    (clone / ".venv").mkdir()
    os.chmod(clone, 0o755)
    return clone


@pytest.fixture(scope="module", params=["root", "an ordinary user"])
def counters(request, tmp_path_factory):
    """The feedback of a reader, a writer and a reader graded by one fork server (a venv under
    /tmp, so that folders lead to it), as root and as an ordinary user; and the folder leading
    to that venv."""
    folder = Path(tempfile.mkdtemp(prefix="txlearn-counters-", dir="/tmp"))
    clone = _venv_under_tmp()
    try:
        paths = _writer_between_readers(folder, clone)
        if request.param == "root":
            exe, roots, path, masks = sandbox.python_layout()
            mp = pytest.MonkeyPatch()
            mp.setattr(sandbox, "python_layout",
                       lambda: (exe, roots + (str(clone / ".venv"),), path, masks))
            try:
                graded = _grade_counting(paths)
            finally:
                mp.undo()
            assert len(graded["started"]) == 1 and len(graded["spawned"]) >= 4, graded
            feedback = {s: r["stable_softmax"].feedback for s, r in graded["by"].items()}
            feedback["errors"] = {s.student: s.error for s in graded["subs"]}
        else:
            from tests.test_grading_attacks import _as_ordinary_user
            rows = _as_ordinary_user(paths, ROOMY, jobs=1, roots=[str(clone / ".venv")])
            feedback = {r[0]: r[3]["stable_softmax"] for r in rows}
            feedback["errors"] = {r[0]: r[2] for r in rows}
    finally:
        subprocess.run(["rm", "-rf", str(folder), str(clone)], check=False)
    return feedback, clone


def test_what_one_runner_writes_in_the_kernels_counters_no_later_runner_reads(counters):
    # the runners of one server shared a pid namespace and the same home, /tmp and /dev/shm:
    # threads started until the next pid was the one wanted, files made until each folder's
    # next inode number was, handed 15 + 3 x 16 bits of a hidden input to the next student
    # graded (and as an ordinary user: access times, user.* notes and default ACLs on the
    # folders leading to a venv under /tmp). Each runner now has a pid namespace and tmpfs
    # folders of its own: a reader before the writer and one after it see the same.
    _assert_nothing_crossed(*counters)


def test_a_runner_in_its_own_pid_namespace_still_dies_of_its_own_signals(counters):
    # pid 1 of a namespace ignores the signals it sends itself: a runner that was pid 1 outlived
    # abort() (reported as a segmentation fault) and SIGXCPU (killed at the hard limit); the
    # runner is pid 2 under an init of its own, which its SIGKILL (sent to pid 1) leaves alone
    assert "aborted" in counters[0]["errors"]["d_aborter"], counters[0]["errors"]


def test_a_runners_kernel_memory_is_bounded(counters):
    # the tmpfs folders were sized in data blocks only: 65,000-byte user.* attributes on empty
    # files held 9.1 GB of the host's slab under a 4096 MB limit, a million empty folders 1 GB.
    # Now each folder holds at most WRITABLE_INODES inodes (about 1.4 KiB of slab each with a
    # 250-character name, measured: at most 3 x 4096 x 1.4 KiB = 17 MiB a runner) and no
    # attribute can be set; nor can a file be watched (inotify: kernel memory, and the
    # grader's file activity on the read-only binds)
    wrote = json.loads(counters[0]["b_writer"].split("WROTE ", 1)[1].splitlines()[0])
    enospc, enotsup, eperm = 28, 95, 1
    assert len(wrote["fill"]) == 3, wrote      # home, /tmp, /dev/shm
    bound = forkserver.WRITABLE_INODES
    for made, err, *setxattr in wrote["fill"]:
        assert err == enospc and bound - 8 < made < bound, wrote["fill"]
        assert setxattr == [enotsup] * 3, wrote["fill"]      # setxattr, lsetxattr, fsetxattr
    assert wrote["inotify"] == [-1, eperm], wrote["inotify"]


def test_a_runner_reads_nothing_of_the_one_before_in_its_servers_memory(counters):
    # a runner is a copy of its fork server's memory: the server's frames above it held the
    # last runner's wait status (its exit code or signal: 8 bits chosen by the previous
    # student) and the pid its namespace's init had in the server's namespace, where every
    # thread of every runner takes a pid (500 threads moved the next one by 503: bits for the
    # runner after next). The server now reads no wait status (the init writes it to the
    # grader) and gives each init the same pid (clone3's set_tid): a reader after the
    # writer and one after the aborter find the same there
    views = {r: json.loads(counters[0][r].split("SERVER ", 1)[1].split(" READ ", 1)[0])
             for r in ("c_reader", "e_reader")}
    assert "pid" in views["c_reader"], views          # the server's loop was found
    assert views["c_reader"] == views["e_reader"], views


def test_a_runner_holds_no_lock_and_reads_or_clears_no_page_cache_exactly(counters):
    # runners graded at the same time (--jobs) see the same read-only files: a lock or lease
    # held on one, or a watch of its folder (dnotify), is a channel between them, and a pipe
    # resized to 1 MiB is kernel memory outside every limit. A new pipe's inode number comes
    # from a counter of the whole machine, shown by the grader's pipes of every later runner,
    # and a thread's pidfs number by a pidfd: no runner makes either. posix_fadvise(DONTNEED) took a
    # page of a file out of the page cache and preadv2(RWF_NOWAIT), cachestat, mincore (of a
    # file the runner owns: an ordinary user's venv) and Linux AIO read whether it was there:
    # an exact channel to every later runner, and the host's cache emptied. Left: a page a
    # runner reads stays cached, which a later one can tell by timing or by the major fault
    # its first read counts; the writer's eviction did nothing, so both readers count none
    wrote = json.loads(counters[0]["b_writer"].split("WROTE ", 1)[1].splitlines()[0])
    enolck, eperm, enosys, eopnotsupp = 37, 1, 38, 95
    assert wrote["fcntl"] == [enolck] * 5 + [eperm] * 2, wrote["fcntl"]
    assert wrote["numbered"] == [eperm, eperm], wrote["numbered"]
    first, second = (json.loads(counters[0][r].split("READ ", 1)[1].splitlines()[0])[-1]
                     for r in ("a_reader", "c_reader"))
    assert first == second == [eopnotsupp, -1, enosys, -1, enosys, -1, enosys, 0], (first, second)


def test_a_runner_waits_on_no_futex_another_can_wake_and_reads_no_machine_wide_count(counters):
    # two runners graded at once under --jobs 2 mapped one of the files every runner sees: a
    # futex on its pages is keyed by the file, so one waited on chosen words and the other woke
    # them (8 bytes a round); sysinfo gave the machine's thread count, moved by a runner's own
    # threads (100 bits/s to a concurrent one); statfs the host's free blocks, which the grader's
    # gradebook moves. A shared wait now returns at once (EAGAIN), a shared wake wakes nobody,
    # sysinfo, statfs, syslog, bpf and perf_event_open are refused, no page is offered for
    # merging (tests/test_grading_futex.py and
    # tests/test_grading_global_counters.py play both roles, two processes under the filter)
    wrote = json.loads(counters[0]["b_writer"].split("WROTE ", 1)[1].splitlines()[0])
    eagain, enosys = 11, 38
    # the wait, the wake; sysinfo, statfs, syslog, bpf, perf_event_open; PR_SET_MEMORY_MERGE
    assert wrote["k"] == [eagain, 0] + [enosys] * 5 + [-1], wrote["k"]


def test_a_runners_queued_signals_are_bounded(counters):
    # each POSIX timer holds a queued signal counted per uid (96,362 here, about 400 bytes of
    # the kernel's each): as an ordinary user the runners and the grader share that count, so
    # one runner's timers were a number its concurrent classmates could read
    wrote = json.loads(counters[0]["b_writer"].split("WROTE ", 1)[1].splitlines()[0])
    assert wrote["signals"] == runner.QUEUED_SIGNALS and wrote["timers"] <= wrote["signals"], wrote


def _mseal_works():
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    region = mmap.mmap(-1, 4096)
    at = ctypes.addressof(ctypes.c_char.from_buffer(region))
    return libc.syscall(462, ctypes.c_void_p(at), ctypes.c_size_t(4096), 0) == 0


def test_what_the_server_mapped_stays_mapped(counters):
    # the address-space limit is counted above what the preloaded imports map (0.6 GB for the
    # CPU build of torch, 3.2 GB for PyPI's CUDA build, mostly libraries): a runner that
    # unmapped libtorch_cpu's segments (330 MB) then held 2,336 MB of NumPy arrays under a
    # 2,048 MB limit. The server seals what it mapped (mseal, Linux 6.10): no segment of a
    # preloaded library can be unmapped, moved or changed
    wrote = json.loads(counters[0]["b_writer"].split("WROTE ", 1)[1].splitlines()[0])
    segments, changed = wrote["remapped"]
    assert segments > 4, wrote["remapped"]
    if not _mseal_works():
        pytest.skip("no mseal on this kernel (Linux 6.10): the residual README states")
    assert changed == 0, wrote["remapped"]


DEV_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
             "/dev/pts/ptmx")

TOUCH = f'''
import json, os
_W = []
for _p in {DEV_NODES!r}:
    for _act in (lambda: os.utime(_p), lambda: os.utime(_p, ns=(0, 0)),
                 lambda: os.utime(os.open(_p, os.O_RDONLY | os.O_NOCTTY))):
        try:
            _act()
            _W.append(0)
        except OSError as _err:
            _W.append(_err.errno)
def softmax(x, axis=-1):
    raise ValueError("TOUCHED " + json.dumps(_W))
'''

STAT = f'''
import json, os
_R = []
for _p in {DEV_NODES!r}:
    try:
        _s = os.stat(_p)
        _R.append(max(_s.st_atime_ns, _s.st_mtime_ns, _s.st_ctime_ns))
    except OSError as _err:
        _R.append(_err.errno)
def softmax(x, axis=-1):
    raise ValueError("TIMES " + json.dumps(_R))
'''


@pytest.mark.parametrize("who", ["root", "an ordinary user"])
def test_no_runner_sets_the_times_of_a_device_node(who):
    # bubblewrap's /dev binds the host's null, zero, full, random, urandom and tty, and its
    # --remount-ro /dev leaves those binds (and the sandbox's devpts) writable: os.utime(path)
    # (write permission suffices for "now") set the host's /dev/null times, to the nanosecond
    # the writer chose, read by every later runner of every server and run. The filter makes
    # the utime calls do nothing, and /dev/pts is an empty read-only folder (no pty: writing
    # one sets its ptmx's times)
    folder = Path(tempfile.mkdtemp(prefix="txlearn-devnodes-", dir="/tmp"))
    os.chmod(folder, 0o755)
    host = {p: os.stat(p).st_mtime_ns for p in DEV_NODES[:5]}
    paths = [_notebook(SOLUTION, folder / n / "01_softmax.ipynb", answers={"stable_softmax": a})
             for n, a in (("a_reader", STAT), ("b_writer", TOUCH), ("c_reader", STAT))]
    try:
        if who == "root":
            graded = _grade_counting(paths)
            assert len(graded["started"]) == 1, graded
            fb = {s: r["stable_softmax"].feedback for s, r in graded["by"].items()}
        else:
            from tests.test_grading_attacks import _as_ordinary_user
            fb = {r[0]: r[3]["stable_softmax"] for r in _as_ordinary_user(paths, ROOMY, jobs=1)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    first, second = (json.loads(fb[r].split("TIMES ", 1)[1].splitlines()[0])
                     for r in ("a_reader", "c_reader"))
    assert "TOUCHED " in fb["b_writer"], fb["b_writer"]
    assert first == second, (first, second)
    assert {p: os.stat(p).st_mtime_ns for p in DEV_NODES[:5]} == host
    assert first[-1] == 2, first      # no /dev/pts/ptmx: ENOENT
