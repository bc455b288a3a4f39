"""The runner session seen from the grader: one submission's runner started, its cells run, and
the proxies through which the checks reach the learner's objects.

:class:`Session` starts the runner (:mod:`~txlearn.course.grading.sandbox`), runs the planned
cells (restarting without a cell that ran past its limit), lists the learner's names and then
serves the proxies' requests over the wire format (:mod:`~txlearn.course.grading.protocol`).
:class:`Remote` is such a proxy (a :class:`txlearn.checks.LearnerObject`): the checks' ``call``,
``construct``, ``load_state``, ``state_shapes`` and ``forward_backward`` use it as they would a
local object. Everything that comes back is the learner's: checked, bounded and cleaned before a
check sees it; a runner that dies or breaks the protocol raises :class:`RunnerDied`.
"""

from __future__ import annotations

import time

from txlearn.checks import (LearnerChangedInput, LearnerError, LearnerObject, LearnerTimeout,
                            clean)
from txlearn.course.grading import installation, protocol, sandbox
from txlearn.course.grading.forkserver import WRITABLE_INODES
from txlearn.course.grading.sets import CourseSet
from txlearn.course.grading.submission import Cell
from txlearn.course.grading.view import all_txlearn_modules

__all__ = ["Session", "Remote", "RunnerDied", "CannotCross", "WallTimeout", "Stale",
           "format_cell_error", "over_budget", "remote_class", "GRACE_SECONDS", "START_SECONDS",
           "MAX_PROXY_CLASSES"]

GRACE_SECONDS = 3.0        # how long past a limit the grader waits before killing the runner
START_SECONDS = 60.0       # the runner's start (Python and NumPy; torch loads with the cells)


class RunnerDied(BaseException):
    """The runner stopped or broke the protocol: its submission is not graded. A BaseException, so
    that the checks' handlers of the learner's exceptions let it through."""


class CannotCross(BaseException):
    """A check handed the learner's code something that cannot cross to the sandbox (a course
    bug: checks pass data or given(...) callables)."""


class WallTimeout(Exception):
    """The runner did not answer within its limit; the grader killed it."""


def format_cell_error(cell: Cell, reply: dict) -> str:
    """What the table says about a cell that raised in the runner (the learner's text cleaned)."""
    who = "your answer cell" if cell.exercise else f"your {cell.label}"
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    # the runner's text is the learner's: one line each, so that it cannot add a "Hint:" line
    # or a score line of its own to the table and the CSV
    if err.get("type") == "SyntaxError":
        return clean(f"SyntaxError in {who}, line {err.get('lineno')}: {err.get('message', '')}",
                     300)
    text = clean(f"{who} raised {err.get('type', 'an error')}: {err.get('message', '')}", 300)
    frames = err.get("frames") if isinstance(err.get("frames"), list) else []
    return "\n".join([text] + [f"  {clean(f, 160)}" for f in frames[-2:]])


def over_budget(err: dict, limits: dict) -> dict:
    """``err`` (a runner's description of a learner's exception) with its message replaced by
    the grader's own words when the submission ran out of its memory or file budget: "your code
    used more than N MB" (N: the set's ``memory_mb``, files in the writable folders included)."""
    if not isinstance(err, dict):
        return err
    kind, message = str(err.get("type", "")), str(err.get("message", ""))
    memory = int(limits.get("memory_mb", 0) or 0)
    if kind == "MemoryError":
        text = (f"your code used more than {memory} MB (this exercise set's memory limit, its "
                f"files included)")
    elif kind in ("OSError", "IOError") and ("No space left on device" in message
                                             or "File too large" in message):
        text = (f"your code's files outgrew their space (each at most {limits.get('file_mb')} "
                f"MB, at most {WRITABLE_INODES} files and folders in each writable folder; all "
                f"of them count against the {memory} MB memory limit)")
    else:
        return err
    return dict(err, message=text)


class Session:
    """The grader's end of one submission's runner: starts it, runs the cells (restarting without
    a cell that ran past its limit), and serves the proxies' requests."""

    def __init__(self, cs: CourseSet, cells: list[Cell], limits: dict, mode: str,
                 files: list[tuple[str, str]], uid: int | None, hide: tuple[str, ...] = (),
                 pool=None):
        self.cs, self.cells, self.limits, self.mode = cs, cells, limits, mode
        self.pool = pool if mode == "bwrap" else None   # a runner_pool.Pool: forked runners
        self.files, self.uid, self.hide = files, uid, tuple(hide)
        self.process = None
        self.generation = 0
        self.seq = 0
        self.skip: set[int] = set()
        self.cell_errors: dict[int, str] = {}
        self.names: dict[str, dict] = {}
        self.output_dropped = 0
        self.banned: list[dict] = []
        self.frozen = False      # set once hidden cases start: no more self-reports are read
        # the proxy classes made for this submission's type names: per session, so that nothing
        # one runner sends (a flood of made-up names) reaches another student's feedback
        self.proxy_classes: dict[str, type] = {}
        self.seconds = float(limits.get("notebook_seconds", 600))
        self.deadline = time.monotonic() + self.seconds     # the whole notebook, restarts included

    # -- the process --
    def _start(self):
        self.close()
        config = {"limits": self.limits, "imports": self.cs.allowed,
                  "view_modules": self.cs.view_modules,
                  "txlearn_modules": list(all_txlearn_modules())}
        from txlearn.course.grading.runner_pool import preload
        config["preload"] = list(preload(self.cs))   # what the memory limit is counted above
        packages = None
        if self.mode == "bwrap":   # only numpy, torch and what the set declares are installed
            try:
                packages = installation.package_entries(self.cs.packages) + \
                    installation.data_entries(self.cs.data)
            except RuntimeError as err:
                raise RunnerDied(str(err)) from None
        if self.pool is not None:
            from txlearn.course.grading.runner_pool import ServerGone
            try:
                self.process = self.pool.start(cs=self.cs, limits=self.limits, packages=packages,
                                               hide=self.hide,
                                               config=config, files=self.files, uid=self.uid)
            except ServerGone as err:
                raise RunnerDied(f"the runner did not start ({err})") from None
        else:
            self.process = sandbox.start(mode=self.mode, view_dir=self.cs.view_dir,
                                         files=self.files, limits=self.limits, config=config,
                                         uid=self.uid, packages=packages, hide=self.hide)
        self.generation += 1
        try:
            hello = sandbox.wait_hello(self.process, START_SECONDS)
            if self.uid is not None and hello.get("uid") != self.uid:
                raise protocol.ProtocolError(f"it runs as uid {hello.get('uid')}, not "
                                             f"{self.uid}")
        except (EOFError, TimeoutError, protocol.ProtocolError) as err:
            why = self.process.why_dead() if isinstance(err, EOFError) else str(err) or \
                "it did not start in time"
            output = self.process.sink.text().strip()
            self.close()
            raise RunnerDied(f"the runner did not start ({why})"
                             + (f": {output.splitlines()[-1][:200]}" if output else "")) from None

    def freeze(self) -> None:
        """Stop reading what the runner reports about itself (called before any hidden case):
        the output dropped so far is counted now, nothing after."""
        if self.process is not None and not self.frozen:
            self.output_dropped += self.process.sink.dropped
        self.frozen = True

    def close(self):
        if self.process is not None:
            if not self.frozen:
                self.output_dropped += self.process.sink.dropped
            self.process.kill()
            self.process = None

    def boot(self):
        """Start the runner and run the cells; a cell past its limit is skipped from then on."""
        for _ in range(len(self.cells) + 1):
            self._start()
            if all(self._run_cell(c) for c in self.cells if c.index not in self.skip):
                try:
                    reply, _ = self._request({"op": "names"}, timeout=30)
                except WallTimeout:
                    raise RunnerDied("the runner stopped answering (listing your names)") from None
                self.names = reply.get("names", {}) if isinstance(reply.get("names"), dict) else {}
                return
        raise RunnerDied("every cell ran past its limit")

    def _run_cell(self, cell: Cell) -> bool:
        seconds = float(self.limits["cell_seconds"])
        try:
            reply, _ = self._request({"op": "cell", "index": cell.index, "source": cell.source,
                                      "label": cell.label, "time_limit": seconds},
                                     timeout=seconds + GRACE_SECONDS)
        except WallTimeout:
            reply = {"timeout": seconds}
        if "timeout" in reply:
            who = "your answer cell" if cell.exercise else f"your {cell.label}"
            self.cell_errors[cell.index] = f"{who} did not finish within {seconds:g} s"
            self.skip.add(cell.index)
            return False
        self.output_dropped += int(reply.get("dropped", 0) or 0)
        if reply.get("skipped"):
            self.cell_errors[cell.index] = (f"your {cell.label} imports txlearn.checks, so it was "
                                            f"not run (the grader runs the checks itself)")
        elif not reply.get("ok"):
            reply = dict(reply, error=over_budget(reply.get("error"), self.limits))
            self.cell_errors[cell.index] = format_cell_error(cell, reply)
        return True

    def _past_limit(self) -> RunnerDied:
        self.close()
        return RunnerDied(f"the notebook ran past its limit of {self.seconds:g} s in all")

    def _request(self, msg: dict, blobs=(), *, timeout: float):
        if time.monotonic() >= self.deadline:
            raise self._past_limit()
        if self.process is None:
            self.boot()
        self.seq += 1
        msg = dict(msg, id=self.seq)
        deadline = min(time.monotonic() + timeout, self.deadline)
        channel = self.process.channel
        try:
            channel.send(msg, list(blobs), deadline)
            reply, reply_blobs = channel.recv(deadline)
        except TimeoutError:
            if time.monotonic() >= self.deadline:
                raise self._past_limit() from None
            self.close()
            raise WallTimeout() from None
        except EOFError:
            why = self.process.why_dead()
            self.close()
            raise RunnerDied(f"the runner died: {why}") from None
        except protocol.ProtocolError as err:
            self.close()
            raise RunnerDied(f"the runner's reply broke the protocol ({err})") from None
        if reply.get("id") != self.seq:
            self.close()
            raise RunnerDied("the runner's replies are out of step (something wrote to its "
                             "channel)")
        return reply, reply_blobs

    def report(self) -> None:
        if self.process is None or self.frozen:
            return
        try:
            reply, _ = self._request({"op": "report"}, timeout=30)
        except (WallTimeout, RunnerDied):
            return
        banned = reply.get("banned", [])
        if isinstance(banned, list):
            self.banned += [b for b in banned if isinstance(b, dict)][:50]

    # -- the proxies' requests --
    def _ref(self, value):
        if isinstance(value, Remote) and value._session is self:
            if value._generation not in (None, self.generation):
                raise Stale()
            return {"ref": value._ref}
        raise protocol.ProtocolError(f"a {type(value).__name__} cannot cross to the sandbox")

    def act(self, op: str, target: "Remote", values: dict, time_limit, label: str):
        cap = float(self.limits["call_seconds"])
        seconds = cap if time_limit is None else min(float(time_limit), cap)
        encoder = protocol.MessageEncoder(on_other=self._ref)
        try:
            payload = {k: encoder.encode(v) for k, v in values.items()}
            ref = self._ref(target)["ref"]
        except Stale:
            raise LearnerError("RuntimeError", "this object was lost when the runner restarted "
                                               "after a timeout") from None
        except protocol.ProtocolError as err:
            raise CannotCross(f"the check of this exercise hands your code something that "
                               f"cannot cross to the sandbox ({err}); a course bug") from None
        msg = {"op": op, "target": ref, "time_limit": seconds, "label": label, **payload}
        try:
            reply, blobs = self._request(msg, encoder.blobs, timeout=seconds + GRACE_SECONDS)
        except WallTimeout:
            raise LearnerTimeout(seconds) from None
        if "timeout" in reply:
            raise LearnerTimeout(seconds)
        if not reply.get("ok"):
            err = over_budget(reply.get("error"), self.limits) \
                if isinstance(reply.get("error"), dict) else {}
            frames = [str(f)[:160] for f in err.get("frames", [])][:6] \
                if isinstance(err.get("frames"), list) else []
            raise LearnerError(str(err.get("type", "Error"))[:80],
                               str(err.get("message", ""))[:2000], frames)
        decoder = protocol.MessageDecoder(blobs, on_handle=self._handle)
        try:
            mutated = reply.get("mutated", [])
            if not isinstance(mutated, list) or not all(isinstance(m, list) and len(m) == 2
                                                        for m in mutated):
                raise protocol.ProtocolError("bad list of changed arguments")
            return decoder.decode(reply.get("value")), [(k, decoder.decode(v))
                                                        for k, v in mutated]
        except protocol.ProtocolError as err:
            self.close()
            raise RunnerDied(f"the runner's reply broke the protocol ({err})") from None

    def _handle(self, obj: dict):
        if "handle" not in obj or not isinstance(obj.get("handle"), int):
            raise protocol.ProtocolError("expected a handle")
        return remote_class(str(obj.get("type", "object")), self.proxy_classes)(
            self, {"handle": obj["handle"]}, f"your {str(obj.get('type', 'object'))[:40]}",
            bool(obj.get("is_module")), self.generation)

    def proxy(self, name: str) -> "Remote":
        info = self.names.get(name, {})
        return remote_class(str(info.get("type", "object")), self.proxy_classes)(
            self, {"name": name}, name, bool(info.get("module")), None)


class Stale(Exception):
    """A proxy of a runner that has since restarted (its objects are gone)."""


class Remote(LearnerObject):
    """A proxy for an object in a submission's runner (a name of its namespace, or a handle to
    something a reply could not send); the checks' call/construct/load_state/... use it."""

    def __init__(self, session, ref, name, is_module, generation):
        self._session, self._ref, self.name = session, ref, name
        self._is_module, self._generation = is_module, generation

    def remote_call(self, args, kwargs, time_limit):
        value, mutated = self._session.act("call", self, {"args": list(args),
                                                          "kwargs": dict(kwargs)},
                                           time_limit, self.name)
        # arrays the learner's code changed in place: the check's own arrays stay as they were
        # (its expected values are computed from them), and the change itself is the failure
        keys = [k for k, _ in mutated
                if (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(args))
                or (isinstance(k, str) and k in kwargs)]
        if keys:
            raise LearnerChangedInput(keys[0] if isinstance(keys[0], str) else int(keys[0]))
        return value

    def remote_load_state(self, state, time_limit):
        self._session.act("load_state", self, {"state": dict(state)}, time_limit, self.name)

    def remote_state_shapes(self, time_limit):
        value, _ = self._session.act("state_shapes", self, {}, time_limit, self.name)
        if not isinstance(value, dict):
            raise RunnerDied("the runner's reply broke the protocol (state shapes)")
        # names are the learner's text: one line each (a name holding "\nHint: ..." added a
        # hint line of its own to the feedback)
        return {clean(k, 200): tuple(v) for k, v in value.items()}

    def remote_cache_shapes(self, time_limit):
        value, _ = self._session.act("cache_shapes", self, {}, time_limit, self.name)
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, (list, tuple)) and all(isinstance(s, (list, tuple)) for s in v)
                for v in value):
            raise RunnerDied("the runner's reply broke the protocol (cache shapes)")
        return [[tuple(int(n) for n in s) for s in v] for v in value]

    def remote_record_starts(self, args, kwargs, steps, time_limit):
        value, _ = self._session.act("record_starts", self,
                                     {"args": list(args), "kwargs": dict(kwargs),
                                      "steps": [list(step) for step in steps]},
                                     time_limit, self.name)
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise RunnerDied("the runner's reply broke the protocol (recorded starts)")
        return [int(v) for v in value]

    def remote_forward_backward(self, args, kwargs, grad_output, time_limit):
        value, _ = self._session.act("forward_backward", self,
                                     {"args": list(args), "kwargs": dict(kwargs),
                                      "grad_output": grad_output}, time_limit, self.name)
        if not isinstance(value, tuple) or len(value) != 2:
            raise RunnerDied("the runner's reply broke the protocol (forward_backward)")
        return value

    def remote_is_module(self):
        return self._is_module

    def remote_method(self, name):
        """A proxy of this object's method ``name`` (the runner looks it up when it is called)."""
        return type(self)(self._session, {**self._ref, "method": name}, f"{self.name}.{name}",
                          False, self._generation)

    def __repr__(self):
        return f"<{self.name} in the sandbox>"


MAX_PROXY_CLASSES = 256   # proxy classes one session makes; past it every new name is "object"


def remote_class(type_name: str, registry: dict[str, type]) -> type:
    """A proxy class named like the learner's object's type, so a check's message says
    "got function" or "got MyModule" as it would in the learner's kernel. ``registry``: the
    session's own classes by name (:attr:`Session.proxy_classes`; never shared between
    submissions), at most :data:`MAX_PROXY_CLASSES` of them."""
    name = "".join(ch for ch in type_name if ch.isalnum() or ch == "_")[:40]
    if not name or not name[0].isalpha():
        name = "object"
    if name not in registry and len(registry) >= MAX_PROXY_CLASSES - 1:
        name = "object"  # a runner cannot make the grader keep classes without end
    if name not in registry:
        registry[name] = type(name, (Remote,), {"__module__": __name__})
    return registry[name]
