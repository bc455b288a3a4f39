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
   output pipe and the sibling notebooks to copy into its home), forks a child that
   - copies the sibling notebooks into the (empty) home, read-only to the job's uid,
   - puts its output pipe on fd 1 and 2 and its protocol pipes on fd 3 and 4, and closes every
     other descriptor (the control socket included),
   - installs the seccomp filter (:mod:`~.seccomp`; one process, no namespace, no IPC, no
     keyring, no ptrace), which the server itself runs without, since it has to fork,
   - runs :func:`txlearn.course.grading.runner.main`, which applies the limits, drops to the
     job's uid when the grader is root, and serves the grader;
3. sends the child's ``pidfd`` back (the grader kills the child through it), waits for the child,
   sends its exit status, and empties the home, ``/tmp`` and ``/dev/shm`` (first as the job's
   uid, then as itself) before it says it is ready again.

What the next submission could find of the previous one is therefore what survives in the
sandbox after its only process died: nothing in the writable folders (emptied, and checked
empty, of mode 1777 and without extended attributes: a default ACL or a note in ``user.*`` on
the folder itself, which an ordinary user's runner owns, would reach the next; otherwise
the server says ``dirty`` and the grader replaces it), no process (the filter forbids fork), no
System V or POSIX IPC object and no key (forbidden too), and the server's own state (priority,
scheduling policy, I/O priority, CPU affinity, resource limits: compared with what they were at
start; changed, the server refuses to go on). The server is never ptraced (it is not dumpable,
and ptrace is forbidden).

Only trusted code runs here before the fork; the learner's code runs only in the child, after
the filter. ``BOOTSTRAP`` is the whole command line, as the runner's is.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat

__all__ = ["BOOTSTRAP", "serve", "MAX_REQUEST_BYTES"]

BOOTSTRAP = ("import json, sys; c = json.loads(sys.argv[1]); sys.path[:] = c['sys_path']; "
             "from txlearn.course.grading.forkserver import serve; serve(c)")

MAX_REQUEST_BYTES = 1 << 20
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


def _empty(folder: str, keep: frozenset = frozenset(), passes: frozenset = frozenset()) -> None:
    """Remove what ``folder`` holds (making folders writable first: the learner may have closed
    them), except the sandbox's own mount points in ``keep`` and the folders leading to them in
    ``passes`` (a venv under /tmp is bound at its own path: /tmp/clone/.venv), which are emptied
    of anything else and given back their mode 0755; errors are left for the check that
    follows."""
    def retry(function, path, _):
        try:
            os.chmod(os.path.dirname(path), 0o700)
            function(path)
        except OSError:
            pass
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.path in keep:
                continue
            if entry.path in passes:
                os.chmod(entry.path, 0o755)
                _empty(entry.path, keep, passes)
            elif entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)
                shutil.rmtree(entry.path, onerror=retry)
            else:
                os.unlink(entry.path)
        except (OSError, RecursionError):
            pass


def _left(folder: str, keep: frozenset, passes: frozenset) -> list[str]:
    """What ``folder`` still holds besides ``keep`` and ``passes`` (and a folder of ``passes``
    whose mode is no longer 0755)."""
    out = []
    for entry in os.scandir(folder):
        if entry.path in keep:
            continue
        if entry.path in passes:
            if stat.S_IMODE(os.stat(entry.path, follow_symlinks=False).st_mode) != 0o755:
                out.append(f"{entry.path} (mode)")
            out += _left(entry.path, keep, passes)
        else:
            out.append(entry.path)
    return out


def _clean(folders: list[str], uid: int | None, keep=()) -> str | None:
    """Empty ``folders`` (as ``uid`` in a child of its own when given, then as the server),
    sparing the sandbox's mount points ``keep`` below them; None when nothing else is left,
    else what is."""
    keep = frozenset(os.path.normpath(k) for k in keep)
    passes = frozenset(str(p) for k in keep for p in _parents(k)
                       if any(_below(str(p), f) for f in folders))
    pid = os.fork()
    if pid == 0:
        try:
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            for folder in folders:
                _empty(folder, keep, passes)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    for folder in folders:
        _empty(folder, keep, passes)
    left = []
    for folder in folders:
        try:
            names = _left(folder, keep, passes)
            mode = os.stat(folder).st_mode
        except OSError as err:
            left.append(f"{folder}: {err.strerror}")
            continue
        if names:
            left.append(f"{folder} holds {len(names)} entries")
        try:     # a default ACL (the next runner's files made mode 000) or a user.* note
            for attr in os.listxattr(folder):
                os.removexattr(folder, attr)
            if os.listxattr(folder):
                left.append(f"{folder} keeps extended attributes")
        except OSError as err:
            if err.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                left.append(f"{folder}'s extended attributes: {err.strerror}")
        if stat.S_IMODE(mode) != 0o1777:
            try:
                os.chmod(folder, 0o1777)
            except OSError:
                left.append(f"{folder} has mode {oct(stat.S_IMODE(mode))}")
    return "; ".join(left) or None


def _below(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def _parents(path: str) -> list[str]:
    out, path = [], os.path.dirname(path)
    while path not in ("/", ""):
        out.append(path)
        path = os.path.dirname(path)
    return out


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
    """The forked runner (never returns)."""
    try:
        ctl.close()
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


def serve(config: dict) -> None:
    """The server's entry point (``BOOTSTRAP``); ``config``: ``control_fd``, ``preload``
    (modules), ``seccomp`` (the filter, hex), ``folders`` (the writable folders, the home
    first), ``keep`` (the sandbox's mount points below them, spared by the cleaning)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))
    ctl = socket.socket(fileno=int(config["control_fd"]))
    program = bytes.fromhex(config["seccomp"])
    folders = list(config["folders"])
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
        pid = os.fork()
        if pid == 0:
            _child(request, fds, ctl, libc, program, folders[0])
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        _send(ctl, {"pid": pid}, [pidfd])
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        _send(ctl, {"exit": status})
        problem = _clean(folders, request["config"].get("uid"), config.get("keep", ()))
        if problem is None and _state() != baseline:
            problem = ("the server's priority, scheduling, I/O priority, CPU affinity or "
                       "limits were changed")
        if problem is not None:
            _send(ctl, {"dirty": problem})
            break
        _send(ctl, {"ready": True})
    os._exit(0)
