"""Futexes keyed on a file every runner sees: concurrent runners of different workers, one
waiting and one waking, passed 8 bytes a round through the kernel's futex table (shared keys
are the file's inode and page, whoever maps it); the seccomp filter now makes every shared
wait return at once and every shared wake wake nobody, so no runner is ever a waiter another
can find or wake (private futexes, which threads and locks use, are untouched)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy

from tests.seccomp_probe import PROLOGUE

# a file every runner of every set sees, read-only (NumPy's compiled core)
SHARED = str(next(Path(numpy.__file__).parent.glob("*core/_multiarray_umath*.so")))
FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine().lower()]

# the mapping's address, and one futex call on the word at page `page`, word `word` of it
MAP = PROLOGUE + f'''
import mmap, os, struct, threading, time
fd = os.open({SHARED!r}, os.O_RDONLY)
m = mmap.mmap(fd, 8 * 4096, prot=mmap.PROT_READ)
class Buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t)] + [
        ("rest%d" % i, ctypes.c_void_p) for i in range(8)]
view = Buffer()
ctypes.pythonapi.PyObject_GetBuffer(ctypes.py_object(m), ctypes.byref(view), 0)
class Time(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
def at(page, word):
    return ctypes.c_void_p(view.buf + page * 4096 + word * 4)
def value(page, word):
    return ctypes.c_uint(struct.unpack_from("I", m, page * 4096 + word * 4)[0])
def futex(page, word, op, val, timeout=None):
    done = libc.syscall({FUTEX}, at(page, word), op, val,
                        ctypes.byref(timeout) if timeout else None, None, 0)
    return [done, ctypes.get_errno() if done < 0 else 0]
'''

# the waiter: one thread per byte of the message, each waiting (up to 20 s) on the word whose
# index is that byte, in its own page; says "waiting" on stdout, then what its waits returned
WAITER = MAP + '''
out = {}
def wait(page, byte):
    out[page] = futex(page, byte, 0, value(page, byte), Time(20, 0))   # FUTEX_WAIT, shared
threads = [threading.Thread(target=wait, args=(i, b)) for i, b in enumerate(b"HIDDEN42")]
print("waiting", flush=True)
for t in threads:
    t.start()
for t in threads:
    t.join()
print([out[i] for i in range(8)], flush=True)
'''

# the waker: until the waiter is done, wakes each word of the 8 pages in turn (FUTEX_WAKE and
# FUTEX_WAKE_BITSET, shared); a wake that woke someone names a byte
WAKER = MAP + '''
got = {}
while sys.stdin.readline().strip() == "go" and len(got) < 8:
    for page in range(8):
        for word in range(256):
            if futex(page, word, 1, 1)[0] > 0 or futex(page, word, 10, 1)[0] > 0:
                got[page] = word
    print(bytes(got.get(i, 63) for i in range(8)).decode("latin-1"), flush=True)
'''


def _roles(mode):
    """Run the waiter and the waker (each under the filter when ``mode`` is "filtered"): what
    the waker read and what the waiter's waits returned."""
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, mode], stdout=subprocess.PIPE,
                              text=True)
    waker = subprocess.Popen([sys.executable, "-c", WAKER, mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline().strip() == "waiting"
        read = "?" * 8
        while waiter.poll() is None and "?" in read:   # until every byte is read or the
            waker.stdin.write("go\n")                   # waiter is done
            waker.stdin.flush()
            read = waker.stdout.readline().strip()
        waits = waiter.stdout.readline().strip()
    finally:
        for p in (waiter, waker):
            p.kill()
            p.wait()
    return read, waits


def test_without_the_filter_a_waiter_and_a_waker_pass_a_message():
    # the channel itself, as the kernel has it: the test can fail
    read, _ = _roles("plain")
    assert read == "HIDDEN42", read


def test_under_the_filter_no_shared_wait_waits_and_no_shared_wake_finds_one():
    read, waits = _roles("filtered")
    eagain = 11
    assert read == "?" * 8, read
    assert waits == str([[-1, eagain]] * 8), waits
