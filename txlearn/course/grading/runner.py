"""The grader's runner: runs a learner's cells inside the sandbox and answers the grader's calls.

``txlearn grade`` (the trusted grader, :mod:`txlearn.course.grading`) never runs a learner's code.
It starts this runner in a sandbox (:mod:`txlearn.course.grading.sandbox`) as
``python -I -S -B -c BOOTSTRAP CONFIG`` with an explicit ``sys.path`` whose first entry is a
synthetic ``txlearn`` holding only this module, :mod:`~txlearn.course.grading.protocol`,
:mod:`~txlearn.learner_calls`, :mod:`~txlearn.course.earlier` and the txlearn modules the exercise
set may import. The runner

1. applies its limits with ``setrlimit`` (address space, CPU time, file size, open files, and
   processes where the sandbox gives it a uid of its own), and, when the sandbox started it as
   root, drops to that unprivileged uid (and checks that it cannot come back), or, in container
   mode as root without such a uid, gives up every capability; in container mode (no bubblewrap
   to load it) it loads the seccomp filter itself, before any learner code;
2. says hello over the protocol pipes (its own file descriptors, not 0/1/2: raw writes to fd 1
   and 2 go to a sink that the grader caps; stdin is empty);
3. serves requests (:mod:`~txlearn.course.grading.protocol` messages) until the grader closes
   the pipe:

   - ``cell``: run one setup or answer cell (never a check cell; a cell that imports
     ``txlearn.checks`` is skipped and reported) under a wall-clock limit, its printed output
     captured and capped;
   - ``names``: the learner's names, each marked callable / ``nn.Module``;
   - ``call``, ``load_state``, ``state_shapes``, ``forward_backward``: act on a name or on a
     handle (an object an earlier reply could not send), under the call's time limit; the
     learner's code gets copies of the arrays, and those it changed in place are named in the
     reply (the in-place rule of :func:`txlearn.learner_calls.call_on_copies`, the same as in
     the learner's kernel), so that the grader's check fails the answer;
   - ``report``: the banned imports attempted and the output dropped.

Each reply is plain data or an error: the exception's type, message and the learner's own frames
as ``"line N in NAME: source"`` (:func:`txlearn.learner_calls.learner_frames`); the time limit,
the state-dict load and forward/backward are :mod:`txlearn.learner_calls`' too. Imports from the
learner's code are checked against the set's rule (the standard library, numpy, torch and what
the set declares): others raise ImportError and are reported for the integrity column. The file
view is the real guard: txlearn's implementation of a graded exercise is not in the sandbox at
all.
"""

from __future__ import annotations

import ast
import builtins
import io
import linecache
import os
import signal
import sys

__all__ = ["main", "Runner", "BOOTSTRAP"]

# The whole command line of the runner: `python -I -S -B -c BOOTSTRAP CONFIG_JSON`.
BOOTSTRAP = ("import json, sys; c = json.loads(sys.argv[1]); sys.path[:] = c['sys_path']; "
             "from txlearn.course.grading.runner import main; main(c)")

MAX_TEXT = 2000          # characters of an exception message sent back
MAX_NAMES = 2000
QUEUED_SIGNALS = 64      # RLIMIT_SIGPENDING: queued signals and POSIX timers, counted per uid


class _Capped(io.TextIOBase):
    """A text stream keeping the first ``limit`` bytes written to it and counting the rest."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def writable(self):
        return True

    def write(self, text):
        text = str(text)
        size = len(text.encode("utf-8", "replace"))
        room = self.limit - self.kept
        if room > 0:
            piece = text[:room]
            self.parts.append(piece)
            self.kept += len(piece.encode("utf-8", "replace"))
        self.dropped += max(0, size - max(room, 0))
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts)


def _describe(err: BaseException, frames, protocol_error: type) -> dict:
    """A learner's exception as plain data: type, message, the learner's ``frames(tb)``."""
    try:
        message = str(err)
    except Exception:  # noqa: BLE001 - a learner's exception whose __str__ fails
        message = "<unprintable>"
    info = {"type": type(err).__name__[:80], "message": message[:MAX_TEXT],
            "frames": frames(err.__traceback__)}
    if isinstance(err, protocol_error):
        info["type"] = "ProtocolLimit"
        info["message"] = f"the value cannot be checked: {message}"[:MAX_TEXT]
    if isinstance(err, SyntaxError):
        info["lineno"] = err.lineno
        info["message"] = str(err.msg)[:MAX_TEXT]
    return info


def _imports_checks(tree) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.startswith("txlearn.checks")
                                                 for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith("txlearn.checks") or (
                    module == "txlearn" and any(a.name == "checks" for a in node.names)):
                return True
    return False


class _Policy:
    """What the learner's code may import: the standard library, numpy, torch, the set's
    declared modules; txlearn only by the full names the set declares."""

    def __init__(self, runner: "Runner", allowed: list[str], txlearn_modules: list[str]):
        self.runner = runner
        self.top = {a for a in allowed if not a.startswith("txlearn")} | {"numpy", "torch"}
        self.txlearn = {a for a in allowed if a.startswith("txlearn.")}
        self.txlearn |= {"txlearn.course", "txlearn.course.earlier"}
        self.known = set(txlearn_modules)          # every module of the real package
        self.stdlib = set(sys.stdlib_module_names) | {"__future__"}
        self.original = builtins.__import__

    def refusal(self, name: str, fromlist) -> str | None:
        top = name.split(".")[0]
        if top == "txlearn":
            wanted = [name] if name != "txlearn" else []
            wanted += [f"txlearn.{f}" for f in (fromlist or ()) if name == "txlearn"
                       and f"txlearn.{f}" in self.known]
            for full in wanted:
                if not any(full == a or full.startswith(a + ".") for a in self.txlearn):
                    return full
            return None
        if top in self.stdlib or top in self.top:
            return None
        return name

    def refuse(self, banned: str) -> ImportError:
        """Record ``banned`` for the integrity column and the ImportError the learner gets."""
        self.runner.banned.append({"module": banned[:120], "where": self.runner.where})
        allowed = ", ".join(sorted(self.top | self.txlearn - {
            "txlearn.course", "txlearn.course.earlier"}))
        return ImportError(f"{banned} may not be imported in this exercise set (answers "
                           f"may use the standard library and {allowed})")

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            banned = self.refusal(name, fromlist)
            # the learner's own import, whatever its globals (exec(..., {}) has fresh ones):
            # decided by who is importing, found on the stack (torch importing sympy is not)
            if banned is not None and (self.runner.is_learner(globals) or
                                       self.runner.learner_initiated(sys._getframe(1))):
                raise self.refuse(banned)
        return self.original(name, globals, locals, fromlist, level)

    def wrap(self, function):
        """``importlib.import_module`` or ``importlib.__import__`` with the same rule (they skip
        ``builtins.__import__``, and a module already loaded never reaches a finder)."""
        policy = self

        def checked(name, *args, **kwargs):
            if isinstance(name, str) and not name.startswith("."):
                banned = policy.refusal(name, kwargs.get("fromlist") or
                                        (args[2] if len(args) > 2 else ()))
                if banned is not None and policy.runner.learner_initiated(sys._getframe(1)):
                    raise policy.refuse(banned)
            return function(name, *args, **kwargs)
        checked.__name__, checked.__doc__ = function.__name__, function.__doc__
        return checked


class _PackageFinder:
    """Refuses (and records) a learner's import of an installed package the set does not
    declare, however it is spelled (``importlib.import_module``, ``exec(..., {})``, ...), while
    torch and numpy still import their own dependencies (sympy, networkx, jinja2, ...)."""

    def __init__(self, runner: "Runner", policy: _Policy):
        self.runner, self.policy = runner, policy

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top == "txlearn" or top in self.policy.stdlib or top in self.policy.top:
            return None
        if self.runner.learner_initiated(sys._getframe(1)):
            raise self.policy.refuse(fullname)
        return None


class _TxlearnFinder:
    """Records (and refuses) imports of txlearn modules that are not in the sandbox's view, however
    they are imported (``importlib.import_module`` included)."""

    def __init__(self, runner: "Runner", view: set[str]):
        self.runner, self.view = runner, view

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("txlearn.") and fullname not in self.view:
            self.runner.banned.append({"module": fullname[:120], "where": self.runner.where})
            raise ImportError(f"{fullname} is not available to answers of this exercise set")
        return None


class Runner:
    """The runner's state: the learner's namespace, the handles, the banned imports."""

    def __init__(self, config: dict):
        from txlearn import learner_calls
        from txlearn.course.grading import protocol
        self.protocol = protocol
        # the rules shared with the learner's kernel (txlearn.learner_calls), kept before any
        # learner code runs: rebinding learner_calls.local_forward_backward from an answer cell
        # does not change what this runner computes (a learner who digs these out of the process
        # can still report gradients computed another way; the grader compares them with its
        # references, so they must still be right)
        self._forward_backward = learner_calls.local_forward_backward
        self._call_on_copies = learner_calls.call_on_copies
        self._load_state_dict = learner_calls.load_state_dict
        self._cache_shapes = learner_calls.cache_shapes
        self._record_starts = learner_calls.record_starts
        self._method_name = learner_calls.METHOD_NAME
        self._time_limit = learner_calls.time_limit
        self._out_of_time = learner_calls.TimeLimitExceeded
        self._frames = learner_calls.learner_frames
        self._strip_magics = learner_calls.strip_magics
        self.config = config
        self.ns = {"__name__": "__main__", "__builtins__": builtins}
        self.handles: dict[int, object] = {}
        self.banned: list[dict] = []
        self.where = "start"
        self.output_limit = int(config["limits"].get("output_kb", 64)) * 1024
        self.output_dropped = 0
        self.policy = _Policy(self, list(config.get("imports", [])),
                              list(config.get("txlearn_modules", [])))
        builtins.__import__ = self.policy
        import importlib
        importlib.import_module = self.policy.wrap(importlib.import_module)
        importlib.__import__ = self.policy.wrap(importlib.__import__)
        self.library_roots = tuple(p.rstrip("/") + "/" for p in sys.path
                                   if p and os.path.basename(p) in ("site-packages",
                                                                    "dist-packages"))
        self.library_roots += tuple(p.rstrip("/") + "/txlearn/" for p in sys.path[:1] if p)
        view = set(config.get("view_modules", []))   # and the packages holding them (the
        view |= {m.rsplit(".", i)[0] for m in view for i in range(1, m.count("."))}  # synthetic)
        sys.meta_path.insert(0, _TxlearnFinder(self, view))
        sys.meta_path.insert(1, _PackageFinder(self, self.policy))

    def learner_initiated(self, frame) -> bool:
        """Whether the code running at ``frame`` acts for the learner: walking outward, a frame
        of the learner's (its namespace, an earlier notebook's, a cell) comes before any frame of
        an installed package or of the view's txlearn (the standard library, the import system
        and code compiled from strings in between are the learner's instruments, not a
        library's own import)."""
        depth = 0
        while frame is not None and depth < 500:
            if self.is_learner(frame.f_globals):
                return True
            filename = frame.f_code.co_filename
            if filename.startswith("<cell "):
                return True
            if filename.startswith(self.library_roots):
                return False
            frame, depth = frame.f_back, depth + 1
        return False

    def describe(self, err: BaseException) -> dict:
        return _describe(err, self._frames, self.protocol.ProtocolError)

    def is_learner(self, globals) -> bool:
        if globals is None:
            return False
        if globals is self.ns:
            return True
        name = globals.get("__name__", "") if isinstance(globals, dict) else ""
        return isinstance(name, str) and name.startswith("txlearn_earlier_")

    # ---- running learner code under a limit -------------------------------------------------

    def timed(self, seconds, thunk):
        """``("ok", value)``, ``("error", info)`` or ``("timeout", seconds)`` for ``thunk()``
        under the time limit of :func:`txlearn.learner_calls.time_limit`, with sys.stdout and
        sys.stderr captured (returned as the third item)."""
        capture = _Capped(self.output_limit)
        saved = sys.stdout, sys.stderr
        try:
            try:
                with self._time_limit(seconds):
                    sys.stdout = sys.stderr = capture
                    try:
                        outcome = ("ok", thunk())
                    except self._out_of_time:
                        raise
                    except BaseException as err:  # noqa: BLE001 - the learner's code raised
                        outcome = ("error", self.describe(err))
            except self._out_of_time:
                outcome = ("timeout", seconds)
        finally:   # after the alarm is off: an alarm cannot skip this
            sys.stdout, sys.stderr = saved
        self.output_dropped += capture.dropped
        return outcome + (capture,)

    # ---- the requests ------------------------------------------------------------------------

    def op_cell(self, msg, blobs):
        source = self._strip_magics(str(msg.get("source", "")))
        filename = f"<cell {int(msg.get('index', 0))}>"
        self.where = str(msg.get("label", filename))[:80]
        try:
            tree = ast.parse(source, filename)
            if _imports_checks(tree):
                return {"ok": False, "skipped": "imports txlearn.checks"}
            code = compile(tree, filename, "exec")
        except SyntaxError as err:
            return {"ok": False, "error": self.describe(err)}
        except (ValueError, MemoryError, RecursionError) as err:
            return {"ok": False, "error": {"type": type(err).__name__, "message": str(err)[:200],
                                           "frames": []}}
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        kind, value, capture = self.timed(msg.get("time_limit"), lambda: exec(code, self.ns))
        reply = {"ok": kind == "ok", "output": capture.getvalue(), "dropped": capture.dropped}
        if kind == "error":
            reply["error"] = value
        elif kind == "timeout":
            reply["timeout"] = value
        return reply

    def op_names(self, msg, blobs):
        names = {}
        torch = sys.modules.get("torch")
        for key, obj in list(self.ns.items())[: MAX_NAMES * 2]:
            if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
                continue
            names[key] = {"callable": callable(obj), "module": self._is_module(obj, torch),
                          "type": type(obj).__name__[:60]}
            if len(names) >= MAX_NAMES:
                break
        return {"ok": True, "names": names}

    @staticmethod
    def _is_module(obj, torch=None) -> bool:
        torch = torch or sys.modules.get("torch")
        try:
            return bool(torch is not None and isinstance(obj, torch.nn.Module))
        except Exception:  # noqa: BLE001 - a learner's object with a strange __class__
            return False

    def _resolve(self, ref):
        if not isinstance(ref, dict):
            raise self.protocol.ProtocolError("bad reference")
        if "method" in ref:   # a public method, looked up when called (inside the time limit)
            name = ref["method"]
            if not isinstance(name, str) or not self._method_name.fullmatch(name):
                raise self.protocol.ProtocolError("bad method name")
            obj = self._resolve({k: v for k, v in ref.items() if k != "method"})
            return lambda *args, **kwargs: getattr(obj, name)(*args, **kwargs)
        if "name" in ref:
            name = ref["name"]
            if name not in self.ns:
                raise NameError(f"name {name!r} is not defined")
            return self.ns[name]
        handle = ref.get("handle")
        if handle not in self.handles:
            raise NameError("an object of an earlier reply is gone")
        return self.handles[handle]

    def _on_handle(self, obj):
        if "ref" not in obj:
            raise self.protocol.ProtocolError("the grader sent a handle")
        return self._resolve(obj["ref"])

    def _keep(self, value) -> dict:
        if len(self.handles) >= 10000:
            raise self.protocol.ProtocolError("too many objects kept")
        handle = len(self.handles) + 1
        self.handles[handle] = value
        return {"handle": handle, "is_module": self._is_module(value),
                "type": type(value).__name__[:60]}

    def _decode_call(self, msg, blobs):
        decoder = self.protocol.MessageDecoder(blobs, on_handle=self._on_handle)
        target = self._resolve(msg.get("target"))
        args = decoder.decode(msg.get("args", []))
        kwargs = decoder.decode(msg.get("kwargs", {"dict": []}))
        if not isinstance(args, list) or not isinstance(kwargs, dict) or \
                not all(isinstance(k, str) for k in kwargs):
            raise self.protocol.ProtocolError("bad arguments")
        return decoder, target, args, kwargs

    def _reply_value(self, kind, value, encoder):
        if kind == "ok":
            return {"ok": True, "value": value}, encoder.blobs
        if kind == "timeout":
            return {"ok": False, "timeout": value}, []
        return {"ok": False, "error": value}, []

    def op_call(self, msg, blobs):
        decoder, target, args, kwargs = self._decode_call(msg, blobs)
        self.where = f"call of {str(msg.get('label', 'your code'))[:60]}"
        encoder = self.protocol.MessageEncoder(on_other=self._keep)

        def thunk():   # the in-place rule: the learner's code gets copies; changed ones go back
            result, changed = self._call_on_copies(target, args, kwargs)
            return encoder.encode(result), [[k, encoder.encode(v)] for k, v in changed]

        kind, value, _ = self.timed(msg.get("time_limit"), thunk)
        if kind != "ok":
            return self._reply_value(kind, value, encoder)
        return {"ok": True, "value": value[0], "mutated": value[1]}, encoder.blobs

    def op_state_shapes(self, msg, blobs):
        target = self._resolve(msg.get("target"))
        encoder = self.protocol.MessageEncoder()
        kind, value, _ = self.timed(msg.get("time_limit"), lambda: encoder.encode(
            {str(k): tuple(int(n) for n in v.shape) for k, v in target.state_dict().items()}))
        return self._reply_value(kind, value, encoder)

    def op_cache_shapes(self, msg, blobs):
        target = self._resolve(msg.get("target"))
        encoder = self.protocol.MessageEncoder()
        kind, value, _ = self.timed(msg.get("time_limit"),
                                    lambda: encoder.encode(self._cache_shapes(target)))
        return self._reply_value(kind, value, encoder)

    def op_record_starts(self, msg, blobs):
        decoder = self.protocol.MessageDecoder(blobs, on_handle=self._on_handle)
        target = self._resolve(msg.get("target"))
        args, kwargs = decoder.decode(msg.get("args")), decoder.decode(msg.get("kwargs"))
        steps = decoder.decode(msg.get("steps"))
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict) \
                or not isinstance(steps, (list, tuple)):
            raise self.protocol.ProtocolError("bad arguments")
        encoder = self.protocol.MessageEncoder()
        kind, value, _ = self.timed(msg.get("time_limit"), lambda: encoder.encode(
            self._record_starts(target, tuple(args), dict(kwargs), list(steps))))
        return self._reply_value(kind, value, encoder)

    def op_load_state(self, msg, blobs):
        decoder = self.protocol.MessageDecoder(blobs, on_handle=self._on_handle)
        target = self._resolve(msg.get("target"))
        state = decoder.decode(msg.get("state"))
        kind, value, _ = self.timed(msg.get("time_limit"),
                                    lambda: self._load_state_dict(target, state))
        return self._reply_value(kind, value, self.protocol.MessageEncoder())

    def op_forward_backward(self, msg, blobs):
        decoder, target, args, kwargs = self._decode_call(msg, blobs)
        grad_output = decoder.decode(msg.get("grad_output"))
        encoder = self.protocol.MessageEncoder(on_other=self._keep)
        self.where = f"forward of {str(msg.get('label', 'your module'))[:60]}"
        kind, value, _ = self.timed(msg.get("time_limit"), lambda: encoder.encode(
            self._forward_backward(target, args, kwargs, grad_output)))
        return self._reply_value(kind, value, encoder)

    def op_report(self, msg, blobs):
        return {"ok": True, "banned": self.banned[:50], "output_dropped": self.output_dropped}

    def serve(self, channel) -> None:
        channel.send({"hello": True, "pid": os.getpid(), "uid": os.getuid()})
        while True:
            try:
                msg, blobs = channel.recv()
            except EOFError:
                return
            op = msg.get("op")
            handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
            try:
                if handler is None:
                    raise self.protocol.ProtocolError(f"unknown request {str(op)[:40]!r}")
                reply = handler(msg, blobs)
            except self._out_of_time:  # an alarm that fired outside the learner's code
                reply = {"ok": False, "timeout": msg.get("time_limit")}
            except self.protocol.ProtocolError as err:
                reply = {"ok": False, "error": {"type": "ProtocolLimit", "frames": [],
                                                "message": f"the value cannot be checked: {err}"}}
            except Exception as err:  # noqa: BLE001 - e.g. NameError of a reference
                reply = {"ok": False, "error": self.describe(err)}
            reply, out_blobs = reply if isinstance(reply, tuple) else (reply, [])
            reply["id"] = msg.get("id")
            try:
                channel.send(reply, out_blobs)
            except self.protocol.ProtocolError as err:
                channel.send({"id": msg.get("id"), "ok": False, "error": {
                    "type": "ProtocolLimit", "frames": [],
                    "message": f"the value cannot be checked: {err}"}})


# ---- start -----------------------------------------------------------------------------------

def _apply_limits(limits: dict, nproc: bool, address_space_mb: int | None = None) -> None:
    import resource
    mb = 1 << 20

    def cap(which, soft, hard=None):
        try:
            resource.setrlimit(which, (soft, soft if hard is None else hard))
        except (ValueError, OSError):
            pass  # cannot raise a limit that is already lower: keep the lower one

    # in the sandbox, memory_mb less the writable folders' sizes (sandbox.address_space_mb)
    cap(resource.RLIMIT_AS, int(address_space_mb or limits["memory_mb"]) * mb)
    cap(resource.RLIMIT_CPU, int(limits["cpu_seconds"]), int(limits["cpu_seconds"]) + 5)
    cap(resource.RLIMIT_FSIZE, int(limits["file_mb"]) * mb)
    cap(resource.RLIMIT_NOFILE, int(limits.get("open_files", 128)))
    cap(resource.RLIMIT_CORE, 0)
    # each POSIX timer holds one, and the count is the uid's: as an ordinary user the runners
    # of concurrent jobs and the grader share it (one runner's timers were a number the others
    # could read), and each is kernel memory
    cap(resource.RLIMIT_SIGPENDING, QUEUED_SIGNALS)
    if nproc:
        cap(resource.RLIMIT_NPROC, int(limits["processes"]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails instead of killing


def _install_filter(program: bytes) -> None:
    """Load the seccomp filter (:mod:`~.seccomp`) into this process for good (no new privileges
    first, so that an unprivileged process may); exit if it cannot be loaded: container mode
    promises it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    class _Program(ctypes.Structure):   # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(program, len(program))
    fprog = _Program(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    zero = ctypes.c_ulong(0)
    if libc.prctl(38, ctypes.c_ulong(1), zero, zero, zero) != 0 or \
            libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), zero, zero) != 0:
        # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER
        os.write(2, f"the seccomp filter could not be installed (errno "
                    f"{ctypes.get_errno()})\n".encode())
        os._exit(70)


def _drop_to(uid: int) -> None:
    """Become ``uid`` (and its group) for good; exit if root could come back."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    try:
        os.setuid(0)
    except PermissionError:
        return
    os._exit(70)


def _drop_capabilities() -> None:
    """Give up every capability for good, staying uid 0 (container mode as root where no other
    uid can run the interpreter): from the bounding set (so that no exec regains one), the
    ambient set, then the effective, permitted and inheritable sets; exit unless
    ``/proc/self/status`` then shows none effective or permitted (the bounding set is emptied
    where the kernel lets it; either way the filter's no-new-privileges, set next, keeps an exec
    from gaining any). Root without capabilities cannot read a file it does
    not own that others may not read (the autograder's hidden cases and results, owned by
    another uid with mode 0700), nor another process's memory or environment (the grader's).
    """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    cap = 0
    while cap < 64 and libc.prctl(24, ctypes.c_ulong(cap), zero, zero, zero) == 0:
        cap += 1   # PR_CAPBSET_DROP, until EINVAL past the kernel's last capability
    libc.prctl(47, ctypes.c_ulong(4), zero, zero, zero)   # PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)           # _LINUX_CAPABILITY_VERSION_3
    data = (ctypes.c_uint32 * 6)()                          # two words of each set, all zero
    libc.capset(header, data)
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            left = [line for line in f if line.startswith(("CapEff:", "CapPrm:"))]
    except OSError:
        left = ["unreadable"]
    if len(left) != 2 or any(int(line.split()[1], 16) for line in left):
        os.write(2, b"the runner could not give up its capabilities\n")
        os._exit(70)


def main(config: dict) -> None:
    """The runner's entry point (``BOOTSTRAP``): limits, privileges, then serve requests."""
    _apply_limits(config["limits"], nproc=bool(config.get("limit_processes")),
                  address_space_mb=config.get("address_space_mb"))
    if config.get("uid") is not None:
        _drop_to(int(config["uid"]))
    elif config.get("drop_capabilities"):
        _drop_capabilities()
    if config.get("seccomp"):   # container mode: no bwrap loaded the filter before us
        _install_filter(bytes.fromhex(config["seccomp"]))
    from txlearn.course.grading.protocol import Channel
    read_fd, write_fd = config["fds"]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    runner = Runner(config)
    runner.serve(Channel(read_fd, write_fd))
    sys.stdout.flush()
    os._exit(0)
