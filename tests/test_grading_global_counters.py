"""Counters of the whole machine a runner can both move and read: ``sysinfo`` gives the number
of threads on the machine (and its free and shared memory, its load), which a runner moves by
starting threads (or writing its tmpfs folders); a concurrent runner of another worker read
12 threads held or not in each 10 ms slot at 100 bits/s with 12% errors on a busy 2-core
machine. And ``statfs`` gives the free blocks of the host's file system under the read-only
binds, which every file the grader writes moves (a gradebook transaction after each notebook).
And where the host runs same-page merging (KSM), a page offered for it is merged with a
concurrent runner's page of the same bytes. The seccomp filter refuses ``sysinfo`` (ENOSYS,
the struct untouched), ``statfs``, ``fstatfs`` and ``ustat``, offers no page for merging,
makes no BPF map (memory outside the address space where unprivileged BPF is on) and no
performance counter (a clock for cache timing), and reads no kernel log (where anyone may, a
crash at a chosen address wrote it there for every later runner)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.seccomp_probe import PROLOGUE

SYSINFO = {"x86_64": 99, "aarch64": 179}[platform.machine().lower()]
BPF, PERF = {"x86_64": (321, 298), "aarch64": (280, 241)}[platform.machine().lower()]
SYSLOG = {"x86_64": 103, "aarch64": 116}[platform.machine().lower()]

# the reader and the writer in one process (the count is the machine's, whoever moves it): the
# threads counted before and while 40 threads of its own wait, in up to 20 rounds (other
# processes start and end threads too); under the filter, what sysinfo returns
ROLES = PROLOGUE + f'''
import threading
info = ctypes.create_string_buffer(b"\\x5a" * 112, 112)   # struct sysinfo; procs at byte 80
def threads():
    done = libc.syscall({SYSINFO}, info)
    return [done, ctypes.get_errno() if done < 0 else 0,
            int.from_bytes(info.raw[80:82], "little")]
seen = []
for _ in range(20):
    before = threads()
    stop = threading.Event()
    held = [threading.Thread(target=stop.wait) for _ in range(40)]
    for t in held:
        t.start()
    during = threads()
    stop.set()
    for t in held:
        t.join()
    seen.append(during[2] - before[2])
    if during[2] - before[2] == 40:
        break
print(before[:2], seen[-1], info.raw == b"\\x5a" * 112)
'''


def _run(mode):
    done = subprocess.run([sys.executable, "-c", ROLES, mode], capture_output=True, text=True,
                          timeout=120)
    return done.stdout.strip(), done.stderr[-2000:]


def test_without_the_filter_a_runners_threads_show_in_the_machines_count():
    out, err = _run("plain")
    assert out == "[0, 0] 40 False", (out, err)   # the channel, as the kernel has it


def test_under_the_filter_sysinfo_is_refused_and_tells_nothing():
    out, err = _run("filtered")
    enosys = 38
    assert out == f"[-1, {enosys}] 0 True", (out, err)


# the free blocks of the file system holding the Python installation (bound read-only in every
# sandbox), before and after 16 MiB are written beside it, as the grader writes a gradebook
# transaction after each notebook: a runner read how much a classmate's row took
DISK = PROLOGUE + f'''
import os, tempfile
def free():
    try:
        return os.statvfs(sys.prefix).f_bfree * os.statvfs(sys.prefix).f_frsize >> 20
    except OSError as err:
        return err.errno
for _ in range(10):
    before = free()
    with tempfile.NamedTemporaryFile(dir=sys.argv[2]) as f:
        f.write(os.urandom(16 << 20))
        f.flush()
        os.fsync(f.fileno())
        during = free()
    if not isinstance(before, int) or before - during >= 16 or before == during:
        break
print(before - during if before != during else before)
'''


def test_without_the_filter_the_grader_s_writes_show_in_the_free_blocks_a_runner_reads(tmp_path):
    folder = tmp_path if os.stat(tmp_path).st_dev == os.stat(sys.prefix).st_dev else sys.prefix
    done = subprocess.run([sys.executable, "-c", DISK, "plain", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert 16 <= int(done.stdout) < 64, (done.stdout, done.stderr[-2000:])


def test_under_the_filter_no_file_systems_free_blocks_are_read(tmp_path):
    done = subprocess.run([sys.executable, "-c", DISK, "filtered", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    enosys = 38
    assert done.stdout.strip() == str(enosys), (done.stdout, done.stderr[-2000:])


# pages offered to the kernel's same-page merging (KSM, where the host runs it): a page a runner
# filled with a guess is merged with a concurrent runner's page of the same bytes, which a write
# to it then takes longer to split (a covert channel known between virtual machines); whether
# the kernel took the offer shows in the region's flags ("mg" in smaps) and in
# PR_GET_MEMORY_MERGE
MERGE = PROLOGUE + f'''
import mmap
region = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
at = ctypes.addressof(ctypes.c_char.from_buffer(region))
done = libc.madvise(ctypes.c_void_p(at), ctypes.c_size_t(1 << 20), 12)   # MADV_MERGEABLE
flags, start = [], None
with open("/proc/self/smaps") as smaps:   # the region's flags: "mg", offered for merging
    for line in smaps:
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):
            start = int(first.split("-")[0], 16)
        elif first == "VmFlags:" and start == at:
            flags = line.split()[1:]
merge = libc.prctl(67, 1, 0, 0, 0)                                        # PR_SET_MEMORY_MERGE
print(done, "mg" in flags, merge, libc.prctl(68, 0, 0, 0, 0))            # PR_GET_MEMORY_MERGE
'''


def _merge(mode):
    done = subprocess.run([sys.executable, "-c", MERGE, mode], capture_output=True, text=True,
                          timeout=120)
    return done.stdout.strip(), done.stderr[-2000:]


def test_without_the_filter_a_runners_pages_are_offered_for_merging():
    out, err = _merge("plain")
    if out.split()[:1] != ["0"]:
        pytest.skip(f"this kernel has no same-page merging (CONFIG_KSM): {out} {err[-200:]}")
    assert out.split()[:2] == ["0", "True"], (out, err)
    if out.split()[2:] != ["0", "1"]:
        pytest.skip(f"no PR_SET_MEMORY_MERGE on this kernel (Linux 6.4): {out}")


def test_under_the_filter_no_page_is_offered_for_merging():
    out, err = _merge("filtered")
    assert out in ("0 False -1 0", "0 False -1 -1"), (out, err)   # -1: no PR_GET (Linux 6.4)


# a BPF map (memory outside the address space, where the host lets unprivileged users make
# them) and a counter of the process's own cycles (a finer clock for cache timing than any)
COUNTERS = PROLOGUE + f'''
import struct
array = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 8, 1 << 20), 72)   # ARRAY, 8 MB
cycles = ctypes.create_string_buffer(struct.pack("IIQ", 0, 128, 0), 128)   # HARDWARE, CYCLES
out = []
for number, args in (({BPF}, (0, array, 72)), ({PERF}, (cycles, 0, -1, -1, 0))):
    done = libc.syscall(number, *args)
    out.append(ctypes.get_errno() if done < 0 else 0)
print(*out)
'''


def test_under_the_filter_no_bpf_map_and_no_performance_counter():
    done = subprocess.run([sys.executable, "-c", COUNTERS, "filtered"], capture_output=True,
                          text=True, timeout=120)
    enosys = 38   # the filter's answer; the kernel's own is EPERM or EACCES where it refuses,
    # or 0 where it lets them (what the same calls answer without the filter, below)
    assert done.stdout.split() == [str(enosys)] * 2, (done.stdout, done.stderr[-2000:])
    plain = subprocess.run([sys.executable, "-c", COUNTERS, "plain"], capture_output=True,
                           text=True, timeout=120)
    assert str(enosys) not in plain.stdout.split() and len(plain.stdout.split()) == 2, plain


# the kernel's log: a process that crashes at an address of its choosing writes it there
# ("segfault at 7ea5e1d0c0de"), and whoever may read the log (anyone where dmesg_restrict is 0)
# reads it in every later runner
CRASH = "import ctypes; ctypes.string_at(0x7ea5e1d0c0de, 1)"
LOG = PROLOGUE + f'''
log = ctypes.create_string_buffer(1 << 20)
done = libc.syscall({SYSLOG}, 3, log, 1 << 20)                  # SYSLOG_ACTION_READ_ALL
print(done if done < 0 else 0, ctypes.get_errno() if done < 0 else 0, b"7ea5e1d0c0de" in log.raw)
'''


def _log(mode):
    done = subprocess.run([sys.executable, "-c", LOG, mode], capture_output=True, text=True,
                          timeout=120)
    return done.stdout.strip(), done.stderr[-2000:]


def test_without_the_filter_a_crash_writes_its_address_where_a_later_process_reads_it():
    crash = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, timeout=60)
    assert crash.returncode == -11, crash
    out, err = _log("plain")
    if out.split()[:2] == ["-1", "1"]:
        pytest.skip("this kernel's log is not readable here (dmesg_restrict, not root)")
    try:
        trace = Path("/proc/sys/debug/exception-trace").read_text().strip()
    except OSError:
        trace = "0"
    if trace != "1":
        pytest.skip("this kernel logs no segfaults (debug.exception-trace is not 1)")
    assert out == "0 0 True", (out, err)


def test_under_the_filter_the_kernels_log_is_not_read():
    out, err = _log("filtered")
    enosys = 38
    assert out == f"-1 {enosys} False", (out, err)
