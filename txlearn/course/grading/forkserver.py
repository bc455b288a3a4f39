"""The runners' fork server: one sandboxed process imports NumPy and PyTorch once, then forks a
fresh runner for each submission (issue 24).

A runner that starts from nothing spends most of a set-03 notebook's grading in ``import torch``
(about 2 to 3 s of one core here, against 0.3 s for everything else). The grader therefore
starts, per worker and exercise set, one bubblewrap sandbox (:mod:`~.sandbox`, the same file
view, packages and sized writable folders a runner gets) whose command is this server. It

1. imports what the set's setup cells import (``preload``: NumPy, and PyTorch when the set uses
   it) and the runner, before any learner code exists, with one thread per maths library (the
   sandbox's environment), so that a fork copies one thread;
2. for each request on its control socket (an ``AF_UNIX`` ``SOCK_SEQPACKET`` pair; the request
   carries the runner's configuration, and as passed descriptors its two protocol pipes, its
   output pipe and the sibling notebooks to copy into its home), forks the runner's parent,
   which
   - makes a mount namespace and a pid namespace of its own (``unshare``, with the
     CAP_SYS_ADMIN the server's sandbox keeps for this alone), mounts a new tmpfs at the home,
     ``/tmp`` and ``/dev/shm`` (sized in bytes as before, and in inodes: ``nr_inodes``) and puts
     the sandbox's mount points below them back (a venv under /tmp: a recursive clone of its
     bind, read-only as it was, in new folders of mode 0755),
   - forks the namespace's init, which forks the runner (pid 2: signals it sends itself act as
     in any process, where an init ignores them), waits for it and writes its wait status to
     the server; writes the init's pid to the server and exits (the server, a subreaper, is
     the init's parent from then on; killing the init kills the runner);
3. the runner
   - drops CAP_SYS_ADMIN, copies the sibling notebooks into its (new, empty) home, read-only to
     the job's uid,
   - puts its output pipe on fd 1 and 2 and its protocol pipes on fd 3 and 4, and closes every
     other descriptor (the control socket included),
   - installs the seccomp filter (:mod:`~.seccomp`; one process, no namespace, no IPC, no
     keyring, no ptrace, no extended attribute, no inotify), which the server itself runs
     without, since it has to fork,
   - runs :func:`txlearn.course.grading.runner.main`, which applies the limits, drops to the
     job's uid when the grader is root, and serves the grader;
4. the server sends the init's ``pidfd`` (the grader kills the runner through it), waits for
   it, sends the runner's exit status, and says it is ready again.

What the next submission could find of the previous one is therefore what survives in the
sandbox after its only process died, and its namespaces with it: nothing in the writable
folders, which were its own file systems (their entries, inode numbers, access times and
attributes went with them; the server's own folders beneath them were never the runner's to
reach), no pid counter (its pids were those of its own namespace: a runner is always pid 2 and
its first thread pid 3), no process (the filter forbids fork), no System V or POSIX IPC object
and no key (forbidden too), and the server's own state (priority, scheduling policy, I/O
priority, CPU affinity, resource limits: compared with what they were at start; changed, the
server says ``dirty`` and the grader replaces it; a runner cannot name its server anyway: it
is outside its pid namespace). The server is never ptraced (it is not dumpable, and
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


_CLONE_NEWNS, _CLONE_NEWPID = 0x00020000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
_OPEN_TREE_CLONE, _AT_RECURSIVE, _MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 4
_OPEN_TREE, _MOVE_MOUNT = 428, 429   # the same numbers on x86-64 and aarch64
_PR_SET_CHILD_SUBREAPER, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 36, 47, 4
_CAP_SYS_ADMIN = 21


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
    """Give the calling process (the runner's parent, forked from the server) a mount namespace
    of its own holding a new tmpfs at each writable folder of ``sizes`` (``{folder: (bytes,
    inodes)}``), with the sandbox's mount points ``keep`` below them (a venv under /tmp) put
    back, read-only as they were, in new folders of mode 0755; and a new pid namespace for its
    next child. Nothing the runner writes, sets or counts there (entries, inode numbers, access
    times, extended attributes, pids) exists once it is dead, so the next runner starts from
    what the first one found."""
    _check(libc, libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID), "unshare")
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


def _runner_parent(request: dict, fds: list[int], ctl: socket.socket, libc, program: bytes,
                   config: dict, said: int, status: int) -> None:
    """The runner's parent (never returns): makes the runner's namespaces (:func:`_isolate`),
    forks their init (:func:`_init`, which forks the runner), writes the init's pid (as the
    server sees it) or what failed on ``said``, and exits; the init, orphaned, is the server's
    child then (the server is a subreaper)."""
    try:
        sizes = {folder: tuple(size) for folder, size in config["sizes"].items()}
        _isolate(libc, sizes, config.get("keep", ()))
        pid = os.fork()
        if pid == 0:
            os.close(said)
            _init(request, fds, ctl, libc, program, config, status)
        os.write(said, str(pid).encode())
    except BaseException as err:  # noqa: BLE001 - said to the server, which stops
        try:
            os.write(said, f"{type(err).__name__}: {err}".encode()[:500])
        except OSError:
            pass
    finally:
        os._exit(0)


def _init(request: dict, fds: list[int], ctl: socket.socket, libc, program: bytes,
          config: dict, status: int) -> None:
    """Pid 1 of the runner's pid namespace (never returns): forks the runner (pid 2, so that
    the signals it sends itself, ``abort()``'s included, act as in any process: a namespace's
    init ignores them), holds nothing of it (every other descriptor closed), waits for it and
    writes its wait status on ``status``. Killed (the grader's SIGKILL through its pidfd), it
    takes the runner with it."""
    import signal
    try:
        runner = os.fork()
        if runner == 0:
            os.close(status)
            _child(request, fds, ctl, libc, program, config["folders"][0])
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # ignored from inside, as init
        _drop_sys_admin(libc)
        os.closerange(3, status)
        os.closerange(status + 1, 1 << 16)
        _, code = os.waitpid(runner, 0)
        os.write(status, str(code).encode())
    finally:
        os._exit(0)


def _fork_runner(request: dict, fds: list[int], ctl: socket.socket, libc, program: bytes,
                 config: dict) -> tuple[int, int] | str:
    """Fork the runner of ``request`` through its parent (:func:`_runner_parent`): the pid of
    its namespace's init and the pipe on which that init writes the runner's wait status, or
    why it could not be started."""
    said_r, said_w = os.pipe()
    status_r, status_w = os.pipe()
    parent = os.fork()
    if parent == 0:
        os.close(said_r)
        os.close(status_r)
        _runner_parent(request, fds, ctl, libc, program, config, said_w, status_w)
    os.close(said_w)
    os.close(status_w)
    os.waitpid(parent, 0)
    with os.fdopen(said_r, "rb") as said:
        text = said.read(600).decode("utf-8", "replace")
    if not text.isdigit():
        os.close(status_r)
        return text or "its parent died"
    return int(text), status_r


def serve(config: dict) -> None:
    """The server's entry point (``BOOTSTRAP``); ``config``: ``control_fd``, ``preload``
    (modules), ``seccomp`` (the filter, hex), ``folders`` (the writable folders, the home
    first), ``sizes`` (``{folder: [bytes, inodes]}``, each runner's new tmpfs there), ``keep``
    (the sandbox's mount points below them, put back in each runner's)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for option, value in ((_PR_SET_DUMPABLE, 0), (_PR_SET_CHILD_SUBREAPER, 1)):
        libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
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
    baseline = _state()
    _send(ctl, {"ready": True, "preloaded": sorted(config.get("preload", []))})
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
        pid, said = forked      # the init's: killing it kills the runner
        pidfd = os.pidfd_open(pid)
        _send(ctl, {"pid": pid}, [pidfd])
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(said, "rb") as runner_status:
            text = runner_status.read(32).decode("ascii", "replace")
        _send(ctl, {"exit": int(text) if text.isdigit() else status})
        if _state() != baseline:
            _send(ctl, {"dirty": "the server's priority, scheduling, I/O priority, CPU "
                                 "affinity or limits were changed"})
            break
        _send(ctl, {"ready": True})
    os._exit(0)
