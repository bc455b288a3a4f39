"""The runners' fork server: one sandboxed process imports NumPy and PyTorch once, then forks a
fresh runner for each submission (issue 24).

A runner that starts from nothing spends most of a set-03 notebook's grading in ``import torch``
(about 2 to 3 s of one core here, against 0.3 s for everything else). The grader therefore
starts, per worker and exercise set, one bubblewrap sandbox (:mod:`~.sandbox`, the same file
view, packages and sized writable folders a runner gets) whose command is this server. It

1. imports what the set's setup cells import (``preload``: NumPy, and PyTorch when the set uses
   it) and the runner, before any learner code exists, with one thread per maths library (the
   sandbox's environment), so that a fork copies one thread; seals the segments of every
   library loaded (``mseal``, Linux 6.10: a runner cannot unmap what its address-space limit
   is counted above, to put memory of its own there); and goes on as pid 1 of a pid namespace
   of its own (owned by its user namespace, which as an ordinary user is not the one owning
   the sandbox's);
2. for each request on its control socket (an ``AF_UNIX`` ``SOCK_SEQPACKET`` pair; the request
   carries the runner's configuration, and as passed descriptors its two protocol pipes, its
   output pipe and the sibling notebooks to copy into its home), clones the runner's init
   (``clone3``: pid 1 of a new pid namespace, in a new mount namespace, and always pid
   :data:`INIT_PID` in the server's, ``set_tid``, with the CAP_SYS_ADMIN the server's sandbox
   keeps for this alone), which
   - mounts a new tmpfs at the home, ``/tmp`` and ``/dev/shm`` (sized in bytes as before, and
     in inodes: ``nr_inodes``) and puts the sandbox's mount points below them back (a venv
     under /tmp: a recursive clone of its bind, read-only as it was, in new folders of mode
     0755),
   - forks the runner (pid 2: signals it sends itself act as in any process, where an init
     ignores them), waits for it and writes its wait status on a pipe the server passes to the
     grader unread; killing the init kills the runner;
3. the runner
   - drops CAP_SYS_ADMIN, copies the sibling notebooks into its (new, empty) home, read-only to
     the job's uid,
   - puts its output pipe on fd 1 and 2 and its protocol pipes on fd 3 and 4, and closes every
     other descriptor (the control socket included),
   - installs the seccomp filter (:mod:`~.seccomp`; one process, no namespace, no IPC, no
     keyring, no ptrace, no extended attribute, no inotify, no file lock, no new pipe), which
     the server itself runs without, since it has to fork,
   - runs :func:`txlearn.course.grading.runner.main`, which applies the limits, drops to the
     job's uid when the grader is root, and serves the grader;
4. the server sends the init's ``pidfd`` (the grader kills the runner through it) and the
   status pipe, reaps the init without reading its wait status (``waitid`` with no siginfo),
   and says it is ready again.

What the next submission could find of the previous one is therefore what survives in the
sandbox after its only process died, and its namespaces with it: nothing in the writable
folders, which were its own file systems (their entries, inode numbers, access times and
attributes went with them; the server's own folders beneath them were never the runner's to
reach), no pid counter (its pids were those of its own namespace: a runner is always pid 2 and
its first thread pid 3), no process (the filter forbids fork), no System V or POSIX IPC object
and no key (forbidden too), and the server's own state (priority, scheduling policy, I/O
priority, CPU affinity, resource limits: compared with what they were at start; changed, the
server says ``dirty`` and the grader replaces it; a runner cannot name its server anyway: it
is outside its pid namespace). Nor does the server's memory, of which each runner is a copy,
hold anything a runner chose: it never reads a runner's or an init's wait status, and every
pid it is given is :data:`INIT_PID`, whatever pids earlier runners' threads took in its
namespace (with ``os.fork`` the next one was a number the previous runners chose, and the
last exit status sat in its frames). The server is never ptraced (it is not dumpable, and
ptrace is forbidden).

Only trusted code runs here before the fork; the learner's code runs only in the child, after
the filter. ``BOOTSTRAP`` is the whole command line, as the runner's is.
"""

from __future__ import annotations

import json
import os
import shutil
import socket

__all__ = ["BOOTSTRAP", "serve", "MAX_REQUEST_BYTES", "WRITABLE_INODES"]

BOOTSTRAP = ("import json, sys; c = json.loads(sys.argv[1]); sys.path[:] = c['sys_path']; "
             "from txlearn.course.grading.forkserver import serve; serve(c)")

MAX_REQUEST_BYTES = 1 << 20
WRITABLE_INODES = 4096   # the files and folders each of a runner's writable folders may hold
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 4, 38, 22, 2
_FIRST_FREE_FD = 5   # 0-2: stdin, output; 3, 4: the protocol pipes


def _send(ctl: socket.socket, msg: dict, fds=()) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(ctl, [data], list(fds))
    else:
        ctl.send(data)


def _scheduling() -> tuple:
    """The server's scheduling policy and attributes (``sched_getattr``: policy, nice, real-time
    priority, utilisation clamps) and I/O priority (``ioprio_get``), which a process of the same
    uid may change (``sched_setscheduler(ppid, SCHED_IDLE)``) and every later fork inherits."""
    import ctypes
    import platform
    numbers = {"x86_64": (315, 252), "amd64": (315, 252), "aarch64": (275, 31),
               "arm64": (275, 31)}.get(platform.machine().lower())
    out = [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority]
    if numbers is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = ctypes.create_string_buffer(56)            # struct sched_attr, with the clamps
        done = libc.syscall(numbers[0], 0, attr, ctypes.c_uint(56), ctypes.c_uint(0))
        out += [attr.raw if done == 0 else None, libc.syscall(numbers[1], 1, 0)]  # WHO_PROCESS
    return tuple(out)


def _state() -> tuple:
    """What a child of the same uid could change in the server and pass on to the next child."""
    import resource
    limits = tuple(resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource))
                   if n.startswith("RLIMIT_"))
    return (os.getpriority(os.PRIO_PROCESS, 0), tuple(sorted(os.sched_getaffinity(0))), limits,
            _scheduling())


_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_PIDFD = 0x00020000, 0x20000000, 0x1000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
_OPEN_TREE_CLONE, _AT_RECURSIVE, _MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 4
_OPEN_TREE, _MOVE_MOUNT, _CLONE3, _MSEAL = 428, 429, 435, 462   # x86-64 and aarch64 alike
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_SYS_ADMIN = 21
_P_PID, _WEXITED, _SIGCHLD = 1, 4, 17
INIT_PID = 300   # every runner's init, as the server sees it (below any kernel's pid_max, 301+)


def _check(libc, done: int, what: str) -> int:
    import ctypes
    if done < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return done


def _below(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def _parents(path: str) -> list[str]:
    out, path = [], os.path.dirname(path)
    while path not in ("/", ""):
        out.append(path)
        path = os.path.dirname(path)
    return out


def _tops(keep) -> list[str]:
    """The mount points of ``keep`` that no other one holds (a clone of each takes the rest)."""
    keep = sorted({os.path.normpath(k) for k in keep})
    return [k for k in keep if not any(_below(k, other) for other in keep)]


def _isolate(libc, sizes: dict, keep) -> None:
    """Give the calling process (the runner's init, in a mount namespace and a pid namespace of
    its own: :func:`_clone_init`) a new tmpfs at each writable folder of ``sizes`` (``{folder:
    (bytes, inodes)}``), with the sandbox's mount points ``keep`` below them (a venv under
    /tmp) put back, read-only as they were, in new folders of mode 0755. Nothing the runner
    writes, sets or counts there (entries, inode numbers, access times, extended attributes,
    pids) exists once it is dead, so the next runner starts from what the first one found."""
    _check(libc, libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "private mounts")
    clones = [(top, _check(libc, libc.syscall(_OPEN_TREE, -100, top.encode(),
                                              _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC),
                           f"open_tree {top}"))
              for top in _tops(keep) if any(_below(top, f) for f in sizes)]
    for folder, (size, inodes) in sizes.items():
        options = f"size={size},nr_inodes={inodes},mode=1777".encode()
        _check(libc, libc.mount(b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                                options), f"tmpfs {folder}")
    for top, fd in clones:
        for parent in reversed(_parents(top)):
            if any(_below(parent, f) for f in sizes) and not os.path.isdir(parent):
                os.mkdir(parent)
                os.chmod(parent, 0o755)
        os.mkdir(top)
        _check(libc, libc.syscall(_MOVE_MOUNT, fd, b"", -100, top.encode(),
                                  _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {top}")
        os.close(fd)


def _drop_sys_admin(libc) -> None:
    """Remove CAP_SYS_ADMIN (the server's, for :func:`_isolate`) from the calling process's
    effective, permitted and inheritable sets, and clear its ambient set."""
    import ctypes
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)           # _LINUX_CAPABILITY_VERSION_3
    data = (ctypes.c_uint32 * 6)()                          # 2 x (effective, permitted, inh.)
    _check(libc, libc.capget(header, data), "capget")
    for i in range(3):
        data[i] &= ~(1 << _CAP_SYS_ADMIN)
    _check(libc, libc.capset(header, data), "capset")
    libc.prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), ctypes.c_ulong(0),
               ctypes.c_ulong(0), ctypes.c_ulong(0))


def _install_filter(libc, program: bytes) -> None:
    import ctypes

    class _Program(ctypes.Structure):   # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(program, len(program))
    fprog = _Program(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0 or \
            libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "the seccomp filter could not be installed")


def _child(request: dict, fds: list[int], ctl: socket.socket, libc, program: bytes,
           home: str) -> None:
    """The forked runner, pid 2 of its own pid namespace (never returns)."""
    try:
        ctl.close()
        _drop_sys_admin(libc)
        req_r, rep_w, out_w, *file_fds = fds
        for name, fd in zip(request["files"], file_fds):
            if os.path.basename(name) != name or name in ("", ".", ".."):
                raise ValueError(f"bad file name {name!r}")
            path = os.path.join(home, name)
            with os.fdopen(fd, "rb") as src, open(path, "xb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(path, 0o644)
        import fcntl
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for fd in (req_r, rep_w, out_w)]
        os.dup2(moved[2], 1)
        os.dup2(moved[2], 2)
        os.dup2(moved[0], 3)
        os.dup2(moved[1], 4)
        import resource
        os.closerange(_FIRST_FREE_FD, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 2048))
        os.chdir(home)
        import random                # as in a process of its own: its own random streams
        import sys
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        _install_filter(libc, program)
        from txlearn.course.grading.runner import main
        main(dict(request["config"], fds=[3, 4]))
    except BaseException as err:  # noqa: BLE001 - said on fd 2 (the grader's sink), then exit
        try:
            os.write(2, f"the fork server's child failed: {type(err).__name__}: {err}\n"
                        .encode()[:500])
        except OSError:
            pass
    finally:
        os._exit(70)


def _clone_init(flags: int) -> tuple[int, int]:
    """Fork with ``clone3``: the child is pid 1 of a new pid namespace (and in a new mount
    namespace) and :data:`INIT_PID` in the server's, whatever pids earlier runners' threads
    took there (``set_tid``; the server's CAP_SYS_ADMIN); returns ``(0, -1)`` in the child and
    ``(pid, pidfd)`` in the server. ``os.fork`` would hand the server the next free pid of its
    namespace, where every thread of every runner takes one: a number the previous runners
    chose, in the memory the next runner is a copy of."""
    import ctypes
    libc = ctypes.PyDLL(None, use_errno=True)        # the GIL held across the call, as os.fork
    pids = (ctypes.c_int32 * 2)(1, INIT_PID)         # in the new namespace, then in the server's
    pidfd = ctypes.c_int32(-1)
    args = (ctypes.c_uint64 * 10)(flags | _CLONE_NEWPID | _CLONE_PIDFD, ctypes.addressof(pidfd),
                                  0, 0, _SIGCHLD, 0, 0, 0, ctypes.addressof(pids), 2)
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = libc.syscall(ctypes.c_long(_CLONE3), args, ctypes.c_size_t(ctypes.sizeof(args)))
    err = ctypes.get_errno()
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0, -1
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone3: {os.strerror(err)}")
    return pid, pidfd.value


def clone3_works() -> bool:
    """Whether this kernel's ``clone3`` takes ``set_tid`` (Linux 5.5): asked with an empty
    list, it refuses with EINVAL, where 5.3 and 5.4 say E2BIG and older kernels ENOSYS (no
    process is made)."""
    import ctypes
    import errno
    libc = ctypes.CDLL(None, use_errno=True)
    args = (ctypes.c_uint64 * 10)(0, 0, 0, 0, _SIGCHLD, 0, 0, 0, 0, 1)   # set_tid_size 1, none
    done = libc.syscall(ctypes.c_long(_CLONE3), args, ctypes.c_size_t(ctypes.sizeof(args)))
    return done < 0 and ctypes.get_errno() == errno.EINVAL


def _init(request: dict, fds: list[int], ctl: socket.socket, libc, program: bytes,
          config: dict, said: int, status: int) -> None:
    """Pid 1 of the runner's pid namespace (never returns): makes its folders
    (:func:`_isolate`), forks the runner (pid 2, so that the signals it sends itself,
    ``abort()``'s included, act as in any process: a namespace's init ignores them), writes
    ``ok`` or what failed on ``said``, holds nothing of it (every other descriptor closed),
    waits for it and writes its wait status on ``status``, a pipe the grader reads (the server
    never does). Killed (the grader's SIGKILL through its pidfd), it takes the runner with
    it."""
    import signal
    try:
        try:
            sizes = {folder: tuple(size) for folder, size in config["sizes"].items()}
            _isolate(libc, sizes, config.get("keep", ()))
            signal.signal(signal.SIGINT, signal.SIG_DFL)   # ignored from inside, as init
            runner = os.fork()
            if runner == 0:
                os.close(said)
                os.close(status)
                _child(request, fds, ctl, libc, program, config["folders"][0])
            os.write(said, b"ok")
        except BaseException as err:  # noqa: BLE001 - said to the server, which stops
            os.write(said, f"{type(err).__name__}: {err}".encode()[:500])
            raise
        os.close(said)
        _drop_sys_admin(libc)
        os.closerange(3, status)
        os.closerange(status + 1, 1 << 16)
        _, code = os.waitpid(runner, 0)
        os.write(status, str(code).encode())
    finally:
        os._exit(0)


def _fork_runner(request: dict, fds: list[int], ctl: socket.socket, libc, program: bytes,
                 config: dict) -> tuple[int, int, int] | str:
    """Fork the runner of ``request`` through its namespace's init (:func:`_init`): that
    init's pid and pidfd and the pipe on which it writes the runner's wait status (for the
    grader), or why it could not be started."""
    said_r, said_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        pid, pidfd = _clone_init(_CLONE_NEWNS)
    except OSError as err:
        for fd in (said_r, said_w, status_r, status_w):
            os.close(fd)
        return str(err)
    if pid == 0:
        os.close(said_r)
        os.close(status_r)
        _init(request, fds, ctl, libc, program, config, said_w, status_w)
    os.close(said_w)
    os.close(status_w)
    with os.fdopen(said_r, "rb") as said:
        text = said.read(600).decode("utf-8", "replace")
    if text != "ok":
        os.close(status_r)
        os.close(pidfd)
        _reap(libc, pid)
        return text or "its init died"
    return pid, pidfd, status_r


def _reap(libc, pid: int) -> None:
    """Wait for child ``pid`` without reading its wait status (``waitid`` with no siginfo):
    how an init ended (killed by the grader, or on its own after the runner) is the runner's
    to decide, so the server never holds it."""
    import ctypes
    import errno
    while libc.waitid(_P_PID, pid, None, _WEXITED) != 0 and ctypes.get_errno() == errno.EINTR:
        pass


def _seal_libraries(libc) -> int:
    """Seal (``mseal``, Linux 6.10, 64-bit) the segments of every shared object loaded so far
    (the interpreter, NumPy, PyTorch: what the runner's address-space limit is counted above),
    so that no runner, which inherits the seals, can unmap, move or replace them to put
    memory of its own in their room. Returns how many objects were sealed (0 without mseal)."""
    import ctypes

    class _Phdr(ctypes.Structure):   # Elf64_Phdr
        _fields_ = [("type", ctypes.c_uint32), ("flags", ctypes.c_uint32)] + [
            (name, ctypes.c_uint64) for name in ("offset", "vaddr", "paddr", "filesz", "memsz",
                                                 "align")]

    class _Info(ctypes.Structure):   # struct dl_phdr_info
        _fields_ = [("addr", ctypes.c_uint64), ("name", ctypes.c_char_p),
                    ("phdr", ctypes.POINTER(_Phdr)), ("phnum", ctypes.c_uint16)]

    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return 0
    objects = []

    def each(info, size, data):
        info = info.contents
        name = info.name or b""
        if name.startswith(b"/") or (not name and not objects):   # the program is the first
            spans = []
            for k in range(info.phnum):
                header = info.phdr[k]
                if header.type == 1:   # PT_LOAD
                    low = (info.addr + header.vaddr) & ~0xFFF
                    spans.append((low, (info.addr + header.vaddr + header.memsz + 0xFFF) & ~0xFFF))
            objects.append(spans)
        else:
            objects.append([])
        return 0

    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Info), ctypes.c_size_t,
                                ctypes.c_void_p)(each)
    libc.dl_iterate_phdr(callback, None)
    sealed = 0
    for spans in objects:
        if not spans:
            continue
        whole = [(min(lo for lo, _ in spans), max(hi for _, hi in spans))]   # holes included
        for todo in (whole, spans):
            if all(libc.syscall(ctypes.c_long(_MSEAL), ctypes.c_void_p(lo),
                                ctypes.c_size_t(hi - lo), ctypes.c_ulong(0)) == 0
                   for lo, hi in todo):
                sealed += 1
                break
            if ctypes.get_errno() == 38:   # ENOSYS: no mseal here
                return 0
    return sealed


def _own_pid_namespace(libc, ctl: socket.socket) -> None:
    """Go on as pid 1 of a new pid namespace, owned by this process's user namespace (as an
    ordinary user bubblewrap's command runs in a user namespace nested in the one owning the
    sandbox's pid namespace, where ``set_tid`` would need CAP_SYS_ADMIN): the sandbox's first
    process forks the server there, closes its end of ``ctl`` and waits for it."""
    _check(libc, libc.unshare(_CLONE_NEWPID), "unshare")
    server = os.fork()
    if server == 0:
        return
    ctl.close()
    os.closerange(3, 1 << 16)
    try:
        os.waitpid(server, 0)
    finally:
        os._exit(0)


def serve(config: dict) -> None:
    """The server's entry point (``BOOTSTRAP``); ``config``: ``control_fd``, ``preload``
    (modules), ``seccomp`` (the filter, hex), ``folders`` (the writable folders, the home
    first), ``sizes`` (``{folder: [bytes, inodes]}``, each runner's new tmpfs there), ``keep``
    (the sandbox's mount points below them, put back in each runner's)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))
    ctl = socket.socket(fileno=int(config["control_fd"]))
    program = bytes.fromhex(config["seccomp"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name in config.get("preload", []):
        __import__(name)
    import txlearn.course.grading.runner  # noqa: F401 - compiled and imported once, here
    import txlearn.learner_calls  # noqa: F401
    sealed = _seal_libraries(libc)
    _own_pid_namespace(libc, ctl)
    baseline = _state()
    _send(ctl, {"ready": True, "preloaded": sorted(config.get("preload", [])), "sealed": sealed})
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, MAX_REQUEST_BYTES, 64)
        except OSError:
            break
        if not data:
            break            # the grader closed its end
        request = json.loads(data)
        forked = _fork_runner(request, fds, ctl, libc, program, config)
        for fd in fds:
            os.close(fd)
        if isinstance(forked, str):
            _send(ctl, {"dirty": f"the runner's namespaces could not be made ({forked})"})
            break
        pid, pidfd, status = forked   # the init's: killing it kills the runner
        _send(ctl, {"pid": pid}, [pidfd, status])
        os.close(pidfd)
        os.close(status)
        _reap(libc, pid)
        if _state() != baseline:
            _send(ctl, {"dirty": "the server's priority, scheduling, I/O priority, CPU "
                                 "affinity or limits were changed"})
            break
        _send(ctl, {"ready": True})
    os._exit(0)
