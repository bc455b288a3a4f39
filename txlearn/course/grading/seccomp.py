"""The system calls the grader's sandboxed runner may not make: a seccomp filter.

bubblewrap's ``--seccomp FD`` loads a compiled classic-BPF program (an array of
``struct sock_filter``) into the sandboxed command before it starts, and the fork server
(:mod:`~.forkserver`) installs the same program in each runner it forks; :func:`program` writes
that program here, by hand, with no library. It keeps a submission to one process whose memory the
address-space limit counts (issue 25):

- no new process: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` and ``clone3`` fail
  (EAGAIN; ENOSYS for ``clone3``, so that the C library falls back to ``clone`` for threads, which
  share the one address space and stay allowed);
- no memory outside that address space and the sized tmpfs folders: ``memfd_create``,
  ``memfd_secret`` and System V ``shmget`` fail (EPERM; a segment or memfd written and unmapped
  would hold memory no limit counts), and so do ``socket``/``socketpair`` (kernel buffers);
- nothing that outlives it or reaches another process: no System V message queue or semaphore
  set, no POSIX message queue (``msgget``, ``semget``, ``mq_open``; the IPC namespace is shared
  by the runners one fork server starts in turn), no kernel key (``add_key``, ``request_key``,
  ``keyctl``: the session keyring is inherited from the grader), and no ``ptrace`` or
  ``process_vm_readv``/``writev`` (the fork server shares the uid of its runners when the grader
  is not root); all fail with EPERM;
- no ``io_uring`` (``io_uring_setup``, ``_enter``, ``_register``: EPERM): its operations are
  the system calls above made by the kernel for the process, past this filter
  (``IORING_OP_SOCKET`` made the socket that ``socket`` may not);
- no extended attribute or ACL (``setxattr``, ``lsetxattr``, ``fsetxattr``, ``setxattrat``
  fail with ENOTSUP, as on a file system without them): tmpfs keeps them in kernel memory that
  its ``size`` does not count (65,000-byte ``user.*`` notes on empty files held 9.1 GB under a
  4 GB limit);
- no watch of the files it sees (``inotify_init``, ``inotify_init1``, ``inotify_add_watch``,
  ``fanotify_init``, ``fanotify_mark``: EPERM): on the read-only binds a watch shows the
  grader's and the other runners' file activity, and each one is kernel memory;
- no file lock, lease or folder watch (``flock``, ``fcntl``'s lock commands and ``F_SETLEASE``:
  ENOLCK; ``F_NOTIFY``: EPERM): on a file every runner sees, one held by a runner is read by a
  concurrent one; no pipe resized past 64 KiB (``F_SETPIPE_SZ``: EPERM);
- no new pipe, userfaultfd or pidfd (``pipe``, ``pipe2``, ``userfaultfd``, ``pidfd_open``:
  EPERM): each takes an inode number from a counter of the whole machine (the grader's pipes of
  every later runner show it) or shows the pidfs number every thread takes;
- nothing taken out of the page cache of the files every runner sees (``posix_fadvise``
  DONTNEED, ``madvise`` COLD and PAGEOUT: done as nothing, returning 0), and nothing that reads
  whether a page is there without reading it (``preadv2``/``pwritev2`` with RWF_NOWAIT:
  EOPNOTSUPP; ``cachestat``, ``mincore``, which report on a file the runner owns, as an
  ordinary user's venv, and Linux AIO's ``io_setup``: ENOSYS; ``process_madvise``: EPERM);
- no namespace or mount of its own: ``unshare``, ``setns``, ``mount``, ``umount2``,
  ``pivot_root``, ``chroot`` and the new mount API (``fsopen`` ... ``mount_setattr``) fail (an
  unprivileged user namespace would let the code mount a tmpfs of unbounded size);
- no file's times set (``utime``, ``utimes``, ``futimesat``, ``utimensat``: done as nothing,
  returning 0): bubblewrap's ``/dev`` binds the host's ``null``, ``zero``, ``full``,
  ``random``, ``urandom`` and ``tty`` writable, and setting one's times to "now" needs only
  write permission: a runner wrote them to the nanosecond, read by every later runner;
- no futex another process can find (``futex`` without ``FUTEX_PRIVATE_FLAG``: a wait returns
  at once with EAGAIN, as if the word had changed, and a wake or requeue wakes nobody,
  returning 0; ``futex_waitv``, ``futex_wake``, ``futex_wait`` and ``futex_requeue``: ENOSYS):
  a shared futex on a page of a file is keyed by the file and the page, whoever maps it, so two
  concurrent runners that map one of the files every runner sees (NumPy's core, libc) passed
  bytes through the kernel's futex table, one waiting on chosen words and the other waking
  them, or reading the count of waiters a wake returns (the kernel's own wake at a thread's
  exit, on the address ``set_tid_address`` chose, finds no waiter either). Private futexes
  (threads, locks, condition variables) are untouched; C code that waits on a shared one
  (``pthread_join``, a process-shared lock) spins instead of sleeping;
- no count of the whole machine it can both move and read: ``sysinfo`` (ENOSYS) gives the
  number of threads on the machine, its free and shared memory and its load, which a runner
  moves by starting threads or writing its folders (a concurrent runner of another worker read
  100 bits/s of them, 12% wrong, on a busy 2-core machine); the C library's
  ``sysconf(_SC_PHYS_PAGES)`` then answers from an unfilled struct; nor the free blocks and
  inodes of the host's file systems (``statfs``, ``fstatfs``, ``ustat``: ENOSYS), which the
  read-only binds of ``/usr`` and the Python installation show and which every file the grader
  writes moves (a gradebook's transaction after each notebook: how much feedback a classmate
  got), so ``os.statvfs`` and ``shutil.disk_usage`` fail in a runner;
- no page offered to the kernel's same-page merging (``madvise`` MADV_MERGEABLE: done as
  nothing; ``prctl`` PR_SET_MEMORY_MERGE: EINVAL): where the host runs KSM, a page a runner
  filled with a guess is merged with a concurrent runner's page of the same bytes, and a write
  to it then takes longer;
- no BPF object and no performance counter (``bpf``, ``perf_event_open``: ENOSYS): where the
  host lets unprivileged users make BPF maps, their memory is outside the address space (a
  limit escape), and a counter of its own cycles or cache misses times what a concurrent
  runner does to the shared caches more finely than any clock;
- no read of the kernel's log (``syslog``: ENOSYS): where the host lets anyone read it
  (``kernel.dmesg_restrict`` 0, as on Fedora and RHEL), a runner that crashed at an address of
  its choosing wrote that address there ("segfault at ..."), for every later runner;
- on x86-64, the x32 and 32-bit system call tables are refused whole (ENOSYS).

Known architectures: x86-64 and aarch64 (their system call numbers are below). On another one
:func:`program` returns None and the sandbox runs without the filter (``sandbox.py`` says so in
its risks).
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["program", "ARCHES", "BLOCKED"]

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS = 0x20     # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15        # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35        # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45       # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06        # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
_ERRNO = 0x00050000  # SECCOMP_RET_ERRNO | errno
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000

# (audit arch, machine names, {syscall: number})
ARCHES = {
    "x86_64": (0xC000003E, ("x86_64", "amd64"), {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "memfd_create": 319,
        "memfd_secret": 447, "shmget": 29, "socket": 41, "socketpair": 53, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "msgget": 68, "semget": 64, "mq_open": 240, "add_key": 248,
        "request_key": 249, "keyctl": 250, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
        "setxattrat": 463, "inotify_init": 253, "inotify_add_watch": 254,
        "inotify_init1": 294, "fanotify_init": 300, "fanotify_mark": 301, "flock": 73,
        "fcntl": 72, "fadvise64": 221, "madvise": 28, "process_madvise": 440, "preadv2": 327,
        "pwritev2": 328, "mincore": 27, "cachestat": 451, "io_setup": 206, "pipe": 22,
        "pipe2": 293, "userfaultfd": 323, "pidfd_open": 434, "utime": 132, "utimes": 235,
        "futimesat": 261, "utimensat": 280, "futex": 202, "futex_waitv": 449,
        "futex_wake": 454, "futex_wait": 455, "futex_requeue": 456, "sysinfo": 99,
        "statfs": 137, "fstatfs": 138, "ustat": 136, "prctl": 157,
        "bpf": 321, "perf_event_open": 298, "syslog": 103}),
    "aarch64": (0xC00000B7, ("aarch64", "arm64"), {
        "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "memfd_create": 279, "memfd_secret": 447,
        "shmget": 194, "socket": 198, "socketpair": 199, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "msgget": 186, "semget": 190, "mq_open": 180, "add_key": 217, "request_key": 218,
        "keyctl": 219, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "setxattrat": 463,
        "inotify_init1": 26, "inotify_add_watch": 27, "fanotify_init": 262,
        "fanotify_mark": 263, "flock": 32, "fcntl": 25, "fadvise64": 223, "madvise": 233,
        "process_madvise": 440, "preadv2": 286, "pwritev2": 287, "mincore": 232,
        "cachestat": 451, "io_setup": 0, "pipe2": 59, "userfaultfd": 282, "pidfd_open": 434,
        "utimensat": 88, "futex": 98, "futex_waitv": 449, "futex_wake": 454,
        "futex_wait": 455, "futex_requeue": 456, "sysinfo": 179, "statfs": 43,
        "fstatfs": 44, "prctl": 167, "bpf": 280, "perf_event_open": 241,
        "syslog": 116}),
}
# what each refused call returns
BLOCKED = {"fork": errno.EAGAIN, "vfork": errno.EAGAIN, "clone3": errno.ENOSYS,
           **{name: errno.ENOTSUP for name in ("setxattr", "lsetxattr", "fsetxattr",
                                               "setxattrat")},
           "flock": errno.ENOLCK, "mincore": errno.ENOSYS, "cachestat": errno.ENOSYS,
           "io_setup": errno.ENOSYS,
           **{name: errno.ENOSYS for name in ("futex_waitv", "futex_wake", "futex_wait",
                                              "futex_requeue", "sysinfo", "statfs",
                                              "fstatfs", "ustat", "bpf", "perf_event_open",
                                              "syslog")},
           # a file's times (done as nothing, returning 0): the sandbox's /dev binds the host's
           # device nodes writable, and "now" needs only write permission
           **{name: 0 for name in ("utime", "utimes", "futimesat", "utimensat")}}
# calls refused for some arguments only: {name: (argument, [(test, value, errno)])}, the test
# "eq" (the argument's low 32 bits equal value) or "set" (they have a bit of value); errno 0
# makes the call do nothing and succeed
_F_GETLK, _F_SETLK, _F_SETLKW, _F_OFD_GETLK, _F_OFD_SETLK, _F_OFD_SETLKW = 5, 6, 7, 36, 37, 38
_F_SETLEASE, _F_NOTIFY, _F_SETPIPE_SZ = 1024, 1026, 1031
_FADV_DONTNEED, _MADV_COLD, _MADV_PAGEOUT, _RWF_NOWAIT = 4, 20, 21, 8
_MADV_MERGEABLE, _PR_SET_MEMORY_MERGE = 12, 67
BY_ARGUMENT = {
    # a lock or lease on a file other runners see, a watch of its folder (dnotify), a pipe
    # larger than 64 KiB (kernel memory, counted per uid)
    "fcntl": (1, [("eq", cmd, errno.ENOLCK) for cmd in (
        _F_GETLK, _F_SETLK, _F_SETLKW, _F_OFD_GETLK, _F_OFD_SETLK, _F_OFD_SETLKW, _F_SETLEASE)]
        + [("eq", _F_NOTIFY, errno.EPERM), ("eq", _F_SETPIPE_SZ, errno.EPERM)]),
    # taking pages of the files every runner sees out of the page cache: done as nothing
    "fadvise64": (3, [("eq", _FADV_DONTNEED, 0)]),
    # (and pages offered for merging with identical pages of other processes, KSM: not offered)
    "madvise": (2, [("eq", _MADV_COLD, 0), ("eq", _MADV_PAGEOUT, 0),
                    ("eq", _MADV_MERGEABLE, 0)]),
    "prctl": (0, [("eq", _PR_SET_MEMORY_MERGE, errno.EINVAL)]),
    # reading whether a page is in the page cache without reading it
    "preadv2": (5, [("set", _RWF_NOWAIT, errno.EOPNOTSUPP)]),
    "pwritev2": (5, [("set", _RWF_NOWAIT, errno.EOPNOTSUPP)]),
}
BLOCKED["process_madvise"] = errno.EPERM
# futex's operation (its second argument) without the private flag: a wait (WAIT, WAIT_BITSET,
# WAIT_REQUEUE_PI) returns EAGAIN, a wake or requeue (WAKE, REQUEUE, CMP_REQUEUE, WAKE_OP,
# WAKE_BITSET, CMP_REQUEUE_PI) returns 0, nobody woken; the PI locks write their word, and no
# page two runners may both write exists, so their keys are never shared
_FUTEX_PRIVATE, _FUTEX_COMMAND = 128, ~(128 | 256) & 0xFFFFFFFF   # less the private, clock flags
_FUTEX_SHARED = [(0, errno.EAGAIN), (9, errno.EAGAIN), (11, errno.EAGAIN),
                 (1, 0), (3, 0), (4, 0), (5, 0), (10, 0), (12, 0)]
_ALU_AND_K = 0x54   # BPF_ALU | BPF_AND | BPF_K


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default: this one's, ``platform.machine()``), as the
    bytes bubblewrap reads from ``--seccomp FD``; None for an architecture not in
    :data:`ARCHES`."""
    machine = (machine or platform.machine()).lower()
    found = next((v for v in ARCHES.values() if machine in v[1]), None)
    if found is None:
        return None
    audit_arch, _, numbers = found
    refuse = [(nr, BLOCKED.get(name, errno.EPERM)) for name, nr in sorted(numbers.items())
              if name not in ("clone", "futex") and name not in BY_ARGUMENT]
    out = [_op(_LD_W_ABS, _ARCH),
           _op(_JEQ_K, audit_arch, jt=1, jf=0),
           _op(_RET_K, _ERRNO | errno.ENOSYS),       # another ABI (i386, x32 by arch)
           _op(_LD_W_ABS, _NR)]
    if audit_arch == ARCHES["x86_64"][0]:
        out += [_op(_JGE_K, _X32_BIT, jt=0, jf=1), _op(_RET_K, _ERRNO | errno.ENOSYS)]
    for nr, err in refuse:       # if nr == this one: return its errno, else test the next
        out += [_op(_JEQ_K, nr, jt=0, jf=1), _op(_RET_K, _ERRNO | err)]
    for name, (arg, tests) in sorted(BY_ARGUMENT.items()):
        # not this call: skip the block (the accumulator still holds the number); this call:
        # load the argument, return the errno of the first test it meets, else allow it
        out += [_op(_JEQ_K, numbers[name], jt=0, jf=2 * len(tests) + 2),
                _op(_LD_W_ABS, _ARG0 + 8 * arg)]
        for test, value, err in tests:
            out += [_op(_JEQ_K if test == "eq" else _JSET_K, value, jt=0, jf=1),
                    _op(_RET_K, _ERRNO | err)]
        out.append(_op(_RET_K, _ALLOW))
    # futex: private, allowed; shared, its command decides (not futex: skip, the accumulator
    # still holds the number)
    out += [_op(_JEQ_K, numbers["futex"], jt=0, jf=2 * len(_FUTEX_SHARED) + 4),
            _op(_LD_W_ABS, _ARG0 + 8),
            _op(_JSET_K, _FUTEX_PRIVATE, jt=2 * len(_FUTEX_SHARED) + 1, jf=0),
            _op(_ALU_AND_K, _FUTEX_COMMAND)]
    for command, err in _FUTEX_SHARED:
        out += [_op(_JEQ_K, command, jt=0, jf=1), _op(_RET_K, _ERRNO | err)]
    out.append(_op(_RET_K, _ALLOW))
    out += [_op(_JEQ_K, numbers["clone"], jt=0, jf=3),
            _op(_LD_W_ABS, _ARG0),                   # clone's flags (low 32 bits)
            _op(_JSET_K, _CLONE_THREAD, jt=1, jf=0),
            _op(_RET_K, _ERRNO | errno.EAGAIN),      # a new process
            _op(_RET_K, _ALLOW)]
    return b"".join(out)
