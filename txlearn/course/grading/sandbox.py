"""Start the grader's runner in a bubblewrap sandbox, or (when asked) as a plain process.

The sandbox (Debian package ``bubblewrap``, command ``bwrap``) gives the runner
(:mod:`txlearn.course.grading.runner`) new network, pid, ipc, uts and cgroup namespaces (and a
user namespace when the grader is not root), and a file system of its own:

- read only: ``/usr`` and the ``/lib*`` links, ``/etc/ld.so.cache``, the Python installation and
  the venv the grader runs from (bound at their own paths, so the interpreter finds itself), with
  an installed copy of the ``txlearn`` package masked, and the course checkout, the hidden folder
  and the submissions' folder masked should one of those binds hold them; a synthetic
  ``txlearn`` at :data:`VIEW` (copied in, file by file) holding only the runner, the protocol,
  :mod:`txlearn.learner_calls`, the earlier-answers loader and the modules the set may import;
  the sandbox's own root, ``/dev`` and a ``/proc`` that holds only a copy of ``/proc/cpuinfo``
  (no mountinfo, no pid 1 command line: they showed host paths and this command line);
- private and writable, each a tmpfs of a fixed size (:func:`writable_mb`) taken out of the
  submission's ``memory_mb`` (:func:`address_space_mb`): the home (the working folder, holding
  copies of the sibling notebooks the set uses), ``/tmp`` and ``/dev/shm``; nothing the runner
  writes reaches the host;
- a seccomp filter (:mod:`txlearn.course.grading.seccomp`) that keeps the submission to one
  process (threads allowed) with no memfd, System V segment, socket, namespace or mount of its
  own, so that its address space and those folders are all the memory it has;
- nothing else: no repository, no checks, solutions, hidden cases or other submissions, no
  network, no ``TXLEARN_*`` or other variables of the grader (the environment is cleared; PATH,
  HOME, LANG, TMPDIR, one thread per maths library and MPLBACKEND=Agg are set).

When the grader is root, each job's runner gets an unprivileged uid of its own (61000 and up,
leased with a lock file so that concurrent grading runs never share one), so that RLIMIT_NPROC
means something (the kernel exempts root's uid from it). bubblewrap cannot bind the Python
installation when it runs as that uid if the installation sits in a folder the uid cannot enter
(``/root/.pyenv``), so bwrap runs as root without a user namespace, keeps only CAP_SETUID and
CAP_SETGID for the runner, and the runner drops to the job's uid before it reads anything of the
learner's (and checks that it cannot become root again). The grader kills the whole process
group on a timeout and at the end; with ``--die-with-parent`` and a pid namespace, nothing the
learner's code started outlives it.

``--no-sandbox`` runs the same runner as a plain subprocess (:data:`NO_SANDBOX_RISKS` says what
that leaves open). ``--container`` (or ``TXLEARN_SANDBOX=container``) is for systems that give
each submission a container of its own (Gradescope, a Kubernetes job), where bubblewrap cannot
make its namespaces: the same plain subprocess, with the resource limits and the seccomp filter
the sandbox would have given it (:data:`CONTAINER_RISKS`; docs/containers.md).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

from txlearn.course.grading.installation import (import_mb, other_package_folders, python_layout,
                                                 site_packages, under as _under)
from txlearn.course.grading.protocol import MAX_REPLY_JSON_BYTES, Channel
from txlearn.course.grading.runner import BOOTSTRAP

__all__ = ["available", "bwrap_argv", "python_layout", "start", "wait_hello", "Process",
           "exit_meaning", "kill_group", "close_channel", "runner_config", "UidLease", "NO_SANDBOX_RISKS", "VIEW",
           "HOME", "FIRST_UID", "CONTAINER_RISKS", "CONTAINER_WAY_OUT", "container_wanted",
           "others_can_run"]

VIEW = "/opt/txlearn-view"     # the synthetic txlearn inside the sandbox
HOME = "/home/learner"         # the runner's private working folder inside the sandbox
FIRST_UID = 61000              # the uids leased to jobs when the grader is root
LAST_UID = 61999

NO_SANDBOX_RISKS = (
    "--no-sandbox: each submission's code runs as you ({user}), in a separate process with a "
    "private working folder, a cleared environment and limits on memory, CPU time, file size "
    "and open files, but WITHOUT a sandbox: it can read and change any file you can (your "
    "course checkout, other submissions, the grades file), use the network, and start processes "
    "that outlive the grading. Use it only for notebooks you trust.")

CONTAINER_RISKS = (
    "container mode: each submission's code runs in a plain process of this container, with a "
    "private working folder, a cleared environment, limits on memory, CPU time, file size and "
    "open files, and the seccomp filter (one process, no sockets, no namespaces), as a uid of "
    "its own or, where none can run Python, root without capabilities, but with no file view of "
    "its own: it can read every file of the container that user can (the installed course, "
    "hidden cases not locked away), so the container must hold nothing of other students "
    "(docs/containers.md)")
CONTAINER_WAY_OUT = ("in a container of its own per submission (Gradescope, a Kubernetes job) "
                     "pass --container or set TXLEARN_SANDBOX=container (docs/containers.md)")


def others_can_run() -> bool:
    """Whether another uid can run the grader's interpreter with its packages: the interpreter,
    its folders and its ``sys.path`` entries readable by others, every folder above them
    passable (o+x). Where they are (a venv on the system's Python, as the Gradescope autograder
    installs it), container mode as root runs each runner as a leased uid of its own; where not
    (a Python under ``/root``), the runner stays uid 0 and gives up every capability."""
    python, roots, path, _ = python_layout()
    for entry in {python, *roots, *path}:
        try:
            if not os.stat(entry).st_mode & 0o004:
                return False
            for folder in _ancestors(entry + "/x"):
                if not os.stat(folder).st_mode & 0o001:
                    return False
        except OSError:
            return False
    return True


def container_wanted() -> bool:
    """Whether ``TXLEARN_SANDBOX=container`` asks for container mode."""
    return os.environ.get("TXLEARN_SANDBOX", "").strip().lower() == "container"


def _env(home: str, tmp: str) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg"}


# ---- is there a sandbox? -----------------------------------------------------------------------

@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """``(True, path to bwrap)`` when bubblewrap is installed and can start a sandbox here, else
    ``(False, why not)``."""
    path = shutil.which("bwrap")
    if path is None:
        return False, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    argv = [path, "--unshare-net", "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/",
            "--dev", "/dev"]   # no /proc: the sandbox mounts none
    if os.geteuid() != 0:
        argv.append("--unshare-user")
    try:
        run = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"bubblewrap does not start ({err})"
    if run.returncode != 0:
        first = (run.stderr.strip().splitlines() or ["no message"])[0]
        return False, f"bubblewrap cannot start a sandbox here ({first})"
    return True, path


# ---- uids for jobs (root only) -------------------------------------------------------------------

class UidLease:
    """An unprivileged uid (and gid of the same number) for one job, held with a lock file until
    :meth:`release`, so that concurrent grading runs on one machine never share a uid."""

    def __init__(self):
        folder = Path(tempfile.gettempdir()) / "txlearn-grade-uids"
        folder.mkdir(mode=0o700, exist_ok=True)
        for uid in range(FIRST_UID, LAST_UID + 1):
            fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise RuntimeError(f"every uid from {FIRST_UID} to {LAST_UID} is in use")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- the command -------------------------------------------------------------------------------

def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def writable_mb(limits: dict) -> dict[str, int]:
    """The size in MB of each writable folder of the sandbox: the home and ``/tmp`` (8 x
    ``file_mb`` each) and ``/dev/shm`` (2 x ``file_mb``). Their sum is taken out of the
    submission's ``memory_mb`` (see :func:`address_space_mb`), so files and memory share one
    budget; ``/dev`` itself is read-only and everything else is read-only binds."""
    file_mb = max(1, int(limits["file_mb"]))
    return {HOME: 8 * file_mb, "/tmp": 8 * file_mb, "/dev/shm": 2 * file_mb}


def address_space_mb(limits: dict) -> int:
    """The learner's share of the runner's address space: ``memory_mb`` less the writable
    folders' sizes (its files count against the same budget), never below half of
    ``memory_mb``. The runner's limit is this above what its preloaded imports map
    (:func:`~.installation.import_mb`, in :func:`runner_config`)."""
    memory = int(limits["memory_mb"])
    return max(memory // 2, memory - sum(writable_mb(limits).values()))


def sensitive_paths(extra=()) -> list[str]:
    """Folders of the grader's own that a bound folder might hold (the course checkout, an
    instructor's hidden cases, the submissions' folder, the run's temporary folder, given in
    ``extra``): masked with an empty tmpfs where they lie under ``/usr`` or another bind, so that
    what the sandbox sees does not depend on where the course is checked out."""
    from txlearn.course import build
    out = {os.path.realpath(build.ROOT)} | {os.path.realpath(p) for p in extra if p}
    return sorted(p for p in out if not any(_under(p, q) and p != q for q in out))


def bwrap_argv(bwrap: str, *, view_dir: str, files: list[tuple[str, int]], limits: dict,
               tail: list[str], packages: tuple[str, ...] | None = None,
               view_files: list[tuple[str, int]] | None = None, seccomp_fd: int | None = None,
               hide: tuple[str, ...] = (), cpuinfo_fd: int | None = None, caps=()) -> list[str]:
    """The bubblewrap command line that runs ``tail`` (the runner's command) in the sandbox.

    ``files``: ``(name, fd)`` of files to copy into the private working folder (the sibling
    notebooks); ``limits``: the set's sandbox limits (the writable folders' sizes come from
    :func:`writable_mb`); ``packages``: the site-packages entries to show (:func:`package_entries`;
    every other installed package is hidden under an empty folder); None shows them all.
    ``view_files``: ``(relative path, fd)`` of the view's files, copied into a read-only tmpfs at
    :data:`VIEW` (so that no host path of the view shows); without them ``view_dir`` is bound
    there. ``seccomp_fd``: a file holding :func:`txlearn.course.grading.seccomp.program`;
    ``cpuinfo_fd``: a copy of the host's ``/proc/cpuinfo`` (the one file of ``/proc`` shown).
    ``hide``: more folders to mask (:func:`sensitive_paths`); ``caps``: capabilities kept (the
    fork server's CAP_SYS_ADMIN). No ``/proc`` is mounted (its mountinfo and pid 1's command
    line would show host paths and this command line).
    """
    python, roots, _, masks = python_layout()
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:   # no user namespace: the runner drops to the job's uid itself
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    argv += [a for cap in caps for a in ("--cap-add", cap)]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    for extra in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime"):
        argv += ["--ro-bind-try", extra, extra]
    sizes = writable_mb(limits)
    argv += ["--dev", "/dev", "--size", str(sizes["/dev/shm"] << 20), "--tmpfs", "/dev/shm",
             "--chmod", "1777", "/dev/shm",
             "--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts",  # no pty (a write sets ptmx times)
             "--remount-ro", "/dev"]
    for folder in (HOME, "/tmp"):   # before the binds: a venv under /tmp stays visible
        argv += ["--size", str(sizes[folder] << 20), "--tmpfs", folder, "--chmod", "1777", folder]
    bound = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", *roots]
    for path in sensitive_paths(hide):   # a checkout under /usr: its solutions stay out of view
        if any(_under(path, b) for b in bound) and not any(_under(r, path) for r in roots):
            argv += ["--tmpfs", path, "--remount-ro", path]
    for root in roots:
        argv += ["--ro-bind", root, root]
    for path in sensitive_paths(hide):   # a course checked out inside the Python installation
        if any(_under(path, r) and path != r for r in roots):
            argv += ["--tmpfs", path, "--remount-ro", path]
    for mask in masks:   # read-only, as every tmpfs but the sized folders (below)
        argv += ["--tmpfs", mask, "--remount-ro", mask]
    if packages is not None:
        sites = site_packages() + other_package_folders()
        for site in sites:
            argv += ["--tmpfs", site]
        for entry in packages:
            argv += ["--ro-bind", entry, entry]
        for site in sites:   # after the binds in it: as an ordinary user the runner owns it,
            argv += ["--remount-ro", site]   # and a file left there outlived the runner
    if view_files is None:
        argv += ["--ro-bind", view_dir, VIEW]
    else:
        argv += ["--tmpfs", VIEW]
        for folder in sorted({os.path.dirname(rel) for rel, _ in view_files} - {""}):
            parts = folder.split("/")
            for i in range(1, len(parts) + 1):
                argv += ["--dir", f"{VIEW}/{'/'.join(parts[:i])}"]
        for rel, fd in view_files:
            argv += ["--perms", "0644", "--file", str(fd), f"{VIEW}/{rel}"]
        argv += ["--chmod", "0755", VIEW, "--remount-ro", VIEW]
    made = sorted({a for r in list(roots) + [VIEW] for a in _ancestors(r)
                   if not any(_under(a, r2) for r2 in roots) and not _under(a, "/usr")
                   and a not in (HOME, "/tmp")},   # a venv under /tmp: /tmp stays 1777
                  key=lambda p: p.count("/"))
    for folder in made:   # bwrap creates them 0700: the job's uid must pass through them
        argv += ["--chmod", "0755", folder]
    for name, fd in files:
        argv += ["--perms", "0644", "--file", str(fd), f"{HOME}/{name}"]
    if cpuinfo_fd is not None:   # torch reads the CPU's features there (no other /proc)
        argv += ["--dir", "/proc", "--perms", "0444", "--file", str(cpuinfo_fd), "/proc/cpuinfo"]
    argv += ["--remount-ro", "/"]   # the sandbox's own root: a tmpfs its uid owns without root
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--chdir", HOME, "--clearenv"]
    for key, value in _env(HOME, "/tmp").items():
        argv += ["--setenv", key, value]
    return argv + ["--"] + tail


# ---- a running runner ----------------------------------------------------------------------------

class _Sink(threading.Thread):
    """Drains the runner's fd 1 and 2, keeping the first ``limit`` bytes (raw writes of the
    learner's code land here, never in the grader's memory or terminal)."""

    def __init__(self, fd: int, limit: int):
        super().__init__(daemon=True)
        self.fd, self.limit, self.kept, self.dropped = fd, limit, bytearray(), 0

    def run(self):
        try:
            while True:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    break
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
                self.dropped += max(0, len(chunk) - max(room, 0))
        finally:
            os.close(self.fd)

    def text(self) -> str:
        return self.kept.decode("utf-8", "replace")


class Process:
    """A started runner: its :class:`~txlearn.course.grading.protocol.Channel`, its raw output,
    and how to stop it (the whole process group)."""

    def __init__(self, popen: subprocess.Popen, channel: Channel, sink: _Sink, mode: str,
                 limits: dict, cleanup=None):
        self.popen, self.channel, self.sink, self.mode = popen, channel, sink, mode
        self.limits, self._cleanup = limits, cleanup
        self.killed = False

    def kill(self) -> None:
        """Kill the runner's process group (bwrap and everything in its pid namespace)."""
        self.killed = True
        kill_group(self.popen)
        self.close()

    def close(self) -> None:
        close_channel(self.channel)
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None

    def why_dead(self) -> str:
        """Why the runner stopped, in words (waits a moment for its exit status)."""
        try:
            code = self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "it stopped answering"
        sig = -code if code < 0 else (code - 128 if self.mode == "bwrap" and code > 128 else 0)
        return exit_meaning(-sig if sig else code, self.limits, self.sink.text())


def kill_group(popen: subprocess.Popen) -> None:
    """SIGKILL ``popen``'s process group (a sandbox: bwrap and all in its pid namespace) and
    wait up to 10 s for it."""
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def close_channel(channel: Channel) -> None:
    """Close both of a channel's descriptors (once; they are set to -1)."""
    for fd in (channel.read_fd, channel.write_fd):
        try:
            os.close(fd)
        except OSError:
            pass
    channel.read_fd = channel.write_fd = -1


def exit_meaning(code: int, limits: dict, output: str) -> str:
    """Why a runner stopped, in words: ``code`` is its exit status, or minus the signal that
    killed it; ``output``: what it wrote (its last line is quoted after an exit status)."""
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else \
            f"signal {sig}"
        return {"SIGXCPU": f"its CPU time limit of {limits['cpu_seconds']} s ran out",
                "SIGKILL": f"it was killed (out of memory? the limit is {limits['memory_mb']} MB)",
                "SIGSEGV": "it crashed (segmentation fault)",
                "SIGABRT": "it aborted (often: out of memory)"}.get(name, f"killed by {name}")
    last = output.strip().splitlines()[-1:] or [""]
    detail = f": {last[0][:160]}" if last[0] else ""
    return f"it exited with status {code}{detail}"


def _view_fds(view_dir: str) -> list[tuple[str, int]]:
    out = []
    for folder, dirs, names in os.walk(view_dir):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            out.append((os.path.relpath(path, view_dir),
                        os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
    return out


def _seccomp_fd() -> int | None:
    from txlearn.course.grading.seccomp import program
    code = program()
    if code is None:
        return None
    fd = os.memfd_create("txlearn-seccomp", os.MFD_CLOEXEC)
    os.write(fd, code)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _cpuinfo_fd() -> int | None:
    try:
        with open("/proc/cpuinfo", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    fd = os.memfd_create("txlearn-cpuinfo", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def runner_config(config: dict, *, mode: str, limits: dict, uid: int | None,
                  view_dir: str) -> dict:
    """``config`` with what the runner's ``main`` needs of its sandbox: the job's ``uid``, the
    process and address-space limits (bwrap; the address space in container mode too), the
    seccomp filter it installs itself (container mode: no bwrap loads it) and its ``sys_path``
    (the view first, at :data:`VIEW` in the sandbox, at ``view_dir`` in a plain process); its
    fds are added by whoever starts it (:func:`start`, or a fork server's child).

    Container mode sets no RLIMIT_NPROC: it counts every process of the uid (the grader's own
    threads in the container, root's not at all); the seccomp filter's refusal of fork and clone
    is what keeps the submission to one process there."""
    python_path = list(python_layout()[2])
    space = None
    preload = tuple(config.get("preload", ()))
    if mode == "bwrap":   # the learner's share, above what the preloaded imports map
        space = address_space_mb(limits) + import_mb(preload)
    elif mode == "container":   # no sized tmpfs: its files are on the container's disk
        space = int(limits["memory_mb"]) + import_mb(preload)
    out = dict(config, uid=uid, limit_processes=mode == "bwrap", address_space_mb=space,
               sys_path=[VIEW if mode == "bwrap" else view_dir] + python_path)
    if mode == "container":   # as root without a uid of its own: root without capabilities
        out["drop_capabilities"] = uid is None and os.geteuid() == 0
        from txlearn.course.grading.seccomp import program
        code = program()
        out["seccomp"] = code.hex() if code is not None else None
    return out


def start(*, mode: str, view_dir: str, files: list[tuple[str, str]], limits: dict,
          config: dict, uid: int | None = None, packages: tuple[str, ...] | None = None,
          hide: tuple[str, ...] = ()) -> Process:
    """Start the runner with ``config`` (see :func:`txlearn.course.grading.runner.main`).

    ``mode``: ``"bwrap"`` (the sandbox), ``"plain"`` (a subprocess, for ``--no-sandbox`` and a
    learner's own ``work/``) or ``"container"`` (the same subprocess, which installs the seccomp
    filter and the address-space limit itself); ``files``: ``(name, host path)`` of the sibling notebooks to copy
    into the private folder; ``uid``: the job's uid when the grader is root (bwrap mode, and
    container mode where :func:`others_can_run`);
    ``hide``: the grader's folders to mask should a bound folder hold them
    (:func:`sensitive_paths`).
    """
    python = python_layout()[0]
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    out_r, out_w = os.pipe()
    config = dict(runner_config(config, mode=mode, limits=limits, uid=uid, view_dir=view_dir),
                  fds=[req_r, rep_w])
    keep = [req_r, rep_w]
    if mode == "bwrap":
        fds = [(name, os.open(path, os.O_RDONLY | os.O_CLOEXEC)) for name, path in files]
        view_fds = _view_fds(view_dir)
        seccomp_fd, cpuinfo_fd = _seccomp_fd(), _cpuinfo_fd()
        extra = [("seccomp", seccomp_fd), ("cpuinfo", cpuinfo_fd)]
        extra = [(n, fd) for n, fd in extra if fd is not None]
        keep += [fd for _, fd in fds + view_fds + extra]
        fds = fds + view_fds + extra
        tail = [python, "-I", "-S", "-B", "-c", BOOTSTRAP, json.dumps(config)]
        argv = bwrap_argv(available()[1], view_dir=view_dir, files=fds[:len(files)],
                          limits=limits, tail=tail, packages=packages, view_files=view_fds,
                          seccomp_fd=seccomp_fd, hide=tuple(hide) + (view_dir,),
                          cpuinfo_fd=cpuinfo_fd)
        kwargs = dict(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd="/")
        cleanup = None
    else:
        home = tempfile.mkdtemp(prefix="txlearn-runner-")
        os.makedirs(os.path.join(home, "tmp"))
        for name, path in files:
            shutil.copyfile(path, os.path.join(home, name))
        if uid is not None:   # container mode as root: the job's uid owns its private folder
            for entry in [home, os.path.join(home, "tmp")] + [os.path.join(home, n)
                                                               for n, _ in files]:
                os.chown(entry, uid, uid)
        argv = [python, "-I", "-S", "-B", "-c", BOOTSTRAP, json.dumps(config)]
        kwargs = dict(env=_env(home, os.path.join(home, "tmp")), cwd=home)
        fds = []

        def cleanup():
            shutil.rmtree(home, ignore_errors=True)
    try:
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                                 pass_fds=keep, process_group=0, close_fds=True, **kwargs)
    finally:
        for fd in [req_r, rep_w, out_w] + [fd for _, fd in fds]:
            os.close(fd)
    sink = _Sink(out_r, int(limits.get("output_kb", 64)) * 1024)
    sink.start()
    return Process(popen, Channel(rep_r, req_w, nonblocking=True,
                                          max_json=MAX_REPLY_JSON_BYTES), sink, mode, limits, cleanup)


def wait_hello(process: Process, timeout: float) -> dict:
    """The runner's first message (it is ready), or raise EOFError/TimeoutError."""
    msg, _ = process.channel.recv(deadline=time.monotonic() + timeout)
    if not msg.get("hello"):
        from txlearn.course.grading.protocol import ProtocolError
        raise ProtocolError("the runner did not say hello")
    return msg
