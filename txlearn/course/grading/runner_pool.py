"""The grader's fork servers: each worker's runners forked from a sandbox that imported PyTorch
once (issue 24), instead of a sandbox and an ``import torch`` per notebook.

:class:`Pool` (one per ``txlearn grade`` run) keeps, per worker thread, a
:class:`ForkServer` for each exercise set it grades: a bubblewrap sandbox built exactly as a
runner's (:func:`~.sandbox.bwrap_argv`: the set's file view and packages, the sized home,
``/tmp`` and ``/dev/shm``, the job's uid when the grader is root) whose command is
:mod:`~.forkserver`. :meth:`Pool.start` asks it for a runner and returns a :class:`Forked`, which
a :class:`~.session.Session` uses as it uses a :class:`~.sandbox.Process` (the protocol channel,
the capped output, ``kill`` and ``why_dead``). Concurrent submissions never share a server (one
per worker thread), and one server's submissions follow each other: the next is forked only
after the last one's process is dead, into a pid namespace and writable folders of its own
(:mod:`~.forkserver` says what else is checked).

Used when the sandbox is bubblewrap, the seccomp filter exists for this machine (a forked runner
must not be able to leave a process behind) and the kernel has ``pidfd_open`` (5.3); otherwise
each notebook gets its own sandbox, as before (:func:`supported`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from functools import lru_cache

from txlearn.course.grading import sandbox
from txlearn.course.grading.forkserver import BOOTSTRAP, WRITABLE_INODES
from txlearn.course.grading.protocol import MAX_REPLY_JSON_BYTES, Channel

__all__ = ["Pool", "ForkServer", "Forked", "ServerGone", "supported", "preload", "mount_points",
           "SERVER_START_SECONDS", "MAX_SERVERS_PER_WORKER"]

SERVER_START_SECONDS = 120.0   # a server's start: bubblewrap, Python, NumPy and PyTorch
SETTLE_SECONDS = 30.0          # a child's exit and the folders' emptying
MAX_SERVERS_PER_WORKER = 3     # sets kept warm per worker (each holds an imported PyTorch)
_TORCH = re.compile(r"^\s*(import\s+torch\b|from\s+torch\b)", re.M)


class ServerGone(Exception):
    """The fork server stopped or said something unexpected: the pool starts another."""


@lru_cache(maxsize=1)
def supported() -> tuple[bool, str]:
    """``(True, "")`` when runners can be forked here (bubblewrap works, the seccomp filter
    knows this architecture, the kernel has pidfds), else ``(False, why not)``."""
    from txlearn.course.grading.seccomp import program
    ok, why = sandbox.available()
    if not ok:
        return False, why
    if program() is None:
        return False, "no seccomp filter for this architecture"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as err:
        return False, f"no pidfd_open ({err})"
    from txlearn.course.grading.forkserver import clone3_works
    if not clone3_works():
        return False, "no clone3 with set_tid (Linux 5.5)"
    return True, ""


def preload(cs) -> tuple[str, ...]:
    """What a set's server imports before forking: NumPy, and PyTorch when one of the set's own
    cells (setup, answer stubs) imports it. A learner's ``import torch`` in a set without it is
    the learner's to pay, as it was."""
    out = ["numpy"]
    if any(_TORCH.search(source) for _, _, source in cs.course_cells):
        out += ["torch", "torch.nn", "torch.nn.functional"]
    return tuple(out)


_TWO_PATHS = ("--bind", "--bind-try", "--ro-bind", "--ro-bind-try", "--dev-bind")
_ONE_PATH = ("--tmpfs", "--proc", "--dev", "--mqueue")
_SKIP = {"--symlink": 3, "--file": 3, "--dir": 2}


def mount_points(argv: list[str], folders: list[str]) -> list[str]:
    """The mount points a bubblewrap command line makes below the writable ``folders`` (the
    binds of a Python installed under /tmp, say): the fork server puts them back in each
    runner's new folders."""
    out, i = set(), 0
    while i < len(argv) and argv[i] != "--":
        arg = argv[i]
        if arg in _TWO_PATHS:
            dest, i = argv[i + 2], i + 3
        elif arg in _ONE_PATH:
            dest, i = argv[i + 1], i + 2
        elif arg in _SKIP:
            i += _SKIP[arg]
            continue
        else:
            i += 1
            continue
        dest = os.path.normpath(dest)
        if any(dest.startswith(f.rstrip("/") + "/") for f in folders):
            out.add(dest)
    return sorted(out)


class ForkServer:
    """One fork server's sandbox and control socket (see the module docstring)."""

    def __init__(self, *, view_dir: str, limits: dict, packages, hide: tuple[str, ...],
                 preloaded: tuple[str, ...]):
        from txlearn.course.grading.seccomp import program
        python, _, sys_path, _ = sandbox.python_layout()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        view = sandbox._view_fds(view_dir)
        cpuinfo = sandbox._cpuinfo_fd()
        config = {"sys_path": [sandbox.VIEW] + list(sys_path), "control_fd": theirs.fileno(),
                  "preload": list(preloaded), "seccomp": program().hex(),
                  "folders": list(sandbox.writable_mb(limits)),
                  "sizes": {folder: [mb << 20, WRITABLE_INODES]
                            for folder, mb in sandbox.writable_mb(limits).items()}}
        options = dict(view_dir=view_dir, files=[], limits=limits, packages=packages,
                       view_files=view, seccomp_fd=None, hide=tuple(hide) + (view_dir,),
                       cpuinfo_fd=cpuinfo, caps=("CAP_SYS_ADMIN",))
        bwrap = sandbox.available()[1]
        config["keep"] = mount_points(sandbox.bwrap_argv(bwrap, tail=[], **options),
                                      config["folders"])
        tail = [python, "-I", "-S", "-B", "-c", BOOTSTRAP, json.dumps(config)]
        argv = sandbox.bwrap_argv(bwrap, tail=tail, **options)
        keep = [theirs.fileno()] + [fd for _, fd in view] + ([cpuinfo] if cpuinfo else [])
        try:
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_w,
                                          stderr=out_w, pass_fds=keep, process_group=0,
                                          close_fds=True, cwd="/",
                                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        finally:
            theirs.close()
            for fd in [out_w] + [fd for _, fd in view] + ([cpuinfo] if cpuinfo else []):
                os.close(fd)
        self.sink = sandbox._Sink(out_r, 16 * 1024)
        self.sink.start()
        self.ctl = mine
        self.busy = False        # a child is running or being cleaned up after
        try:
            self._expect("ready", SERVER_START_SECONDS)
        except ServerGone:
            self.stop()
            raise

    def _recv(self, timeout: float):
        self.ctl.settimeout(max(timeout, 0.001))
        try:
            data, fds, _, _ = socket.recv_fds(self.ctl, 1 << 16, 4)
        except (OSError, socket.timeout) as err:
            raise ServerGone(f"the fork server did not answer ({err or 'timeout'})") from None
        if not data:
            output = self.sink.text().strip().splitlines()[-1:] or ["no output"]
            raise ServerGone(f"the fork server stopped: {output[0][:200]}")
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            for fd in fds:
                os.close(fd)
            raise ServerGone("the fork server's message broke its protocol")
        return msg, fds

    def _expect(self, key: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            msg, fds = self._recv(deadline - time.monotonic())
            if "dirty" in msg:
                raise ServerGone(f"the fork server cannot go on ({str(msg['dirty'])[:200]})")
            if key in msg:
                return msg, fds
            for fd in fds:
                os.close(fd)

    def spawn(self, config: dict, files: list[tuple[str, str]], limits: dict) -> "Forked":
        """Fork a runner with ``config`` (the runner's, :func:`txlearn.course.grading.runner.
        main`, without its fds), ``files`` (``(name, host path)``, copied into its home) and the
        notebook's ``limits`` (its output cap, the words of :meth:`Forked.why_dead`)."""
        if self.busy:
            self.settle()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        sent = [req_r, rep_w, out_w]
        try:
            sent += [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for _, path in files]
            request = {"config": config, "files": [name for name, _ in files]}
            self.ctl.settimeout(10)
            socket.send_fds(self.ctl, [json.dumps(request).encode()], sent)
        except OSError as err:
            for fd in (rep_r, req_w, out_r):
                os.close(fd)
            raise ServerGone(f"the fork server is gone ({err})") from None
        finally:
            for fd in sent:
                os.close(fd)
        self.busy = True
        try:
            msg, fds = self._expect("pid", 10)
        except ServerGone:
            for fd in (rep_r, req_w, out_r):
                os.close(fd)
            raise
        if len(fds) != 2:
            for fd in fds + [rep_r, req_w, out_r]:
                os.close(fd)
            raise ServerGone("the fork server sent no pidfd and status pipe")
        sink = sandbox._Sink(out_r, int(limits.get("output_kb", 64)) * 1024)
        sink.start()
        return Forked(self, fds[0], fds[1], Channel(rep_r, req_w, nonblocking=True,
                                                    max_json=MAX_REPLY_JSON_BYTES), sink, limits)

    def settle(self) -> None:
        """Wait until the server is ready for the next child (raises ServerGone)."""
        if self.busy:
            self._expect("ready", SETTLE_SECONDS)
            self.busy = False

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        """Kill the server's sandbox (its process group) and close its socket."""
        sandbox.kill_group(self.popen)
        self.ctl.close()


class Forked:
    """A runner forked by a :class:`ForkServer`: what a Session needs of a
    :class:`~.sandbox.Process` (``channel``, ``sink``, ``kill``, ``why_dead``)."""

    mode = "bwrap"

    def __init__(self, server: ForkServer, pidfd: int, status_fd: int, channel: Channel, sink,
                 limits: dict):
        self.server, self.pidfd, self.channel, self.sink = server, pidfd, channel, sink
        self.status_fd, self.status, self.limits = status_fd, None, limits

    def exit_status(self, timeout: float) -> int | None:
        """The runner's wait status, as its init wrote it (waiting up to ``timeout`` s for it);
        None if unknown (the init was killed first)."""
        if self.status is None and self.status_fd >= 0:
            import select
            if select.select([self.status_fd], [], [], timeout)[0]:
                text = os.read(self.status_fd, 32)
                if text.isdigit():
                    self.status = int(text)
                os.close(self.status_fd)
                self.status_fd = -1
        return self.status

    def kill(self) -> None:
        """Kill the runner (through its pidfd) and wait until its server is ready again (a
        server that is not, is stopped: the pool starts another)."""
        if self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass
            os.close(self.pidfd)
            self.pidfd = -1
        if self.status_fd >= 0:
            os.close(self.status_fd)
            self.status_fd = -1
        sandbox.close_channel(self.channel)
        try:
            self.server.settle()
        except ServerGone:
            self.server.stop()

    def close(self) -> None:
        self.kill()

    def why_dead(self) -> str:
        """Why the runner stopped, in words (waits a moment for its exit status)."""
        status = self.exit_status(5)
        if status is None:
            self.kill()
            return "it stopped answering"
        return sandbox.exit_meaning(os.waitstatus_to_exitcode(status), self.limits,
                                    self.sink.text())


class Pool:
    """The fork servers of one grading run, per worker thread and set; :meth:`close` stops them."""

    def __init__(self):
        self._servers: dict[int, dict[tuple, ForkServer]] = {}
        self._lock = threading.Lock()

    def start(self, *, cs, limits: dict, packages, hide: tuple[str, ...], config: dict,
              files: list[tuple[str, str]], uid: int | None) -> Forked:
        """A runner for a notebook of set ``cs`` (as :func:`~.sandbox.start` would start one in
        its own sandbox; ``config`` the runner's)."""
        config = sandbox.runner_config(config, mode="bwrap", limits=limits, uid=uid,
                                       view_dir=cs.view_dir)
        key = (cs.view_dir, packages, tuple(sorted(sandbox.writable_mb(limits).items())),
               tuple(hide))
        with self._lock:
            mine = self._servers.setdefault(threading.get_ident(), {})
        for attempt in range(2):
            server = mine.pop(key, None)
            if server is not None and not server.alive():
                server.stop()
                server = None
            if server is None:
                while len(mine) >= MAX_SERVERS_PER_WORKER:
                    mine.pop(next(iter(mine))).stop()      # the least recently used
                server = ForkServer(view_dir=cs.view_dir, limits=limits, packages=packages,
                                    hide=hide, preloaded=preload(cs))
            mine[key] = server
            try:
                return server.spawn(config, files, limits)
            except ServerGone:
                mine.pop(key, None)
                server.stop()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            servers = [s for mine in self._servers.values() for s in mine.values()]
            self._servers.clear()
        for server in servers:
            server.stop()
