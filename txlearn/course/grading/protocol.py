"""The wire format between ``txlearn grade`` and its sandboxed runner (never pickle).

The grader (trusted) and the runner (which executes a learner's cells inside the sandbox) exchange
messages over two pipes. One message is::

    4-byte big-endian length N | N bytes of UTF-8 JSON {"m": <message>, "b": [len_0, len_1, ...]}
                               | blob 0 | blob 1 | ...

where each blob is the ``.npy`` bytes of one array (``np.save`` / ``np.load`` with
``allow_pickle=False``). Inside a message, values are plain JSON (None, bool, int, finite float,
str, list) or a one-key object naming what it is:

- ``{"tuple": [...]}``, ``{"dict": [[key, value], ...]}``, ``{"float": "nan" | "inf" | "-inf"}``;
- ``{"ndarray": i}`` (blob i), ``{"npscalar": i}`` (a NumPy scalar, as a 0-d array),
  ``{"tensor": i, "dtype": "torch.float32"}`` (bfloat16 travels as float32 and is cast back);
- ``{"given": kind, "data": {...}}``: a :class:`Given` callable, rebuilt from its kind and data;
- ``{"handle": id, "is_module": bool, "type": name}``: an object the learner's code built that
  cannot cross (a module, a function, anything else), kept in the runner and named by its id;
- ``{"ref": {"name": n}}`` or ``{"ref": {"handle": id}}``: the grader pointing at such an object.

Every message is checked against strict limits (:data:`MAX_MESSAGE_BYTES`, :data:`MAX_JSON_BYTES`,
:data:`MAX_DEPTH`, :data:`MAX_ITEMS`, :data:`MAX_BLOBS`, :data:`MAX_CONTAINERS`) on both sides; a
violation is a :class:`ProtocolError`, never a crash of the reader.

What a message may cost its reader is bounded by its size, not only its bytes (the runner is the
learner's code and may send anything; issue 25): the JSON part is refused before it is parsed when
it holds more than :data:`MAX_CONTAINERS` ``{`` and ``[`` (empty objects cost Python about 25
times their bytes), and the grader reads replies of at most :data:`MAX_REPLY_JSON_BYTES`; an
array is refused unless its dtype is one that may cross (bool, integers, floats, complex, bytes,
str: never a structured, void or object dtype) with an itemsize of at least one byte and its
shape, each zero dimension counted as one, has no more elements than its ``.npy`` blob has bytes.
So decoding a reply of J JSON bytes and A array bytes costs at most about 16 J + A + 32 MiB, and
a float64 or complex128 copy of any array a check makes costs at most 16 times that array's bytes
(:data:`COST_BOUND`).

This module is imported by the runner inside the sandbox, so it needs only NumPy (PyTorch is
imported when a tensor crosses) and :mod:`txlearn.learner_calls` (for :class:`Given`); it never
imports ``txlearn.checks``. What both sides compute the same way lives in
:mod:`txlearn.learner_calls`, not here: this module is the wire format only.
"""

from __future__ import annotations

import io
import json
import math
import os
import select
import struct
import time
from typing import Any, Callable

import numpy as np

from txlearn.learner_calls import Given

__all__ = [
    "ProtocolError",
    "Channel",
    "MessageEncoder",
    "MessageDecoder",
    "MAX_MESSAGE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_BLOBS",
    "MAX_CONTAINERS",
    "MAX_REPLY_JSON_BYTES",
    "ARRAY_KINDS",
    "COST_BOUND",
]

MAX_MESSAGE_BYTES = 128 << 20   # one message, JSON and arrays together
MAX_JSON_BYTES = 32 << 20       # its JSON part
MAX_DEPTH = 32                  # nesting of containers in one value
MAX_ITEMS = 1_000_000           # values (container elements included) in one message
MAX_BLOBS = 4096                # arrays in one message
MAX_CONTAINERS = 100_000        # "{" and "[" in one message's JSON, counted before it is parsed
MAX_REPLY_JSON_BYTES = 4 << 20  # the JSON part of a runner's reply, as the grader reads it
ARRAY_KINDS = "biufcSU"         # the dtype kinds that may cross (never V, O, M, m)
COST_BOUND = ("decoding a reply of J JSON bytes and A array bytes costs the grader at most about "
              "16 J + A + 32 MiB, and any float64/complex128 copy of an array in it at most 16 "
              "times that array's bytes")

_HEADER = struct.Struct(">I")
_TAGS = ("tuple", "dict", "float", "ndarray", "npscalar", "tensor", "given", "handle", "ref")
# the tensor dtypes that may cross; bfloat16 travels as float32
TORCH_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                "uint8", "bool", "complex64", "complex128")


class ProtocolError(Exception):
    """A message breaks the format or one of its limits, or the other side went away."""


# ---- values ------------------------------------------------------------------------------------

class MessageEncoder:
    """Turns values into JSON-able structures; arrays go to :attr:`blobs` as ``.npy`` bytes.

    ``on_other(value) -> dict`` encodes anything else (the runner keeps it and returns a
    handle; the grader names a proxy's remote object); without it such a value raises
    :class:`ProtocolError`.
    """

    def __init__(self, on_other: Callable[[Any], dict] | None = None):
        self.blobs: list[bytes] = []
        self._size = 0
        self._items = 0
        self._on_other = on_other

    def encode(self, value: Any, depth: int = 0) -> Any:
        self._items += 1
        if self._items > MAX_ITEMS:
            raise ProtocolError(f"more than {MAX_ITEMS:,} values in one message")
        if depth > MAX_DEPTH:
            raise ProtocolError(f"nested more than {MAX_DEPTH} levels deep")
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, np.generic):  # before int and float: np.float64 is a float
            if value.dtype.kind in "biufc":
                return {"npscalar": self._blob(np.asarray(value))}
            return self._other(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            value = float(value)
            if math.isfinite(value):
                return value
            return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, str):
            return str(value)
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject or value.dtype.kind not in ARRAY_KINDS or \
                    value.dtype.itemsize == 0:
                return self._other(value)
            return {"ndarray": self._blob(value.view(np.ndarray))}
        if _is_tensor(value):
            return self._tensor(value)
        if isinstance(value, Given):
            return {"given": value.kind, "data": self._dict(value.data, depth)}
        if isinstance(value, tuple):
            return {"tuple": [self.encode(v, depth + 1) for v in tuple(value)]}
        if isinstance(value, list):
            return [self.encode(v, depth + 1) for v in list(value)]
        if isinstance(value, dict):
            return {"dict": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                             for k, v in dict(value).items()]}
        return self._other(value)

    def _dict(self, data: dict, depth: int):
        return {"dict": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                         for k, v in data.items()]}

    def _other(self, value):
        if self._on_other is None:
            raise ProtocolError(f"a {type(value).__name__} cannot cross to the other side "
                                f"(only data and given(...) callables do)")
        return self._on_other(value)

    def _tensor(self, t):
        import torch
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        name = str(t.dtype).removeprefix("torch.")
        if name not in TORCH_DTYPES or t.layout != torch.strided:
            return self._other(t)
        if name == "bfloat16":
            arr = t.float().numpy()
        else:
            arr = t.resolve_conj().resolve_neg().numpy()
        return {"tensor": self._blob(arr), "dtype": name}

    def _blob(self, arr: np.ndarray) -> int:
        if len(self.blobs) >= MAX_BLOBS:
            raise ProtocolError(f"more than {MAX_BLOBS} arrays in one message")
        if arr.nbytes + self._size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"arrays larger than {MAX_MESSAGE_BYTES >> 20} MiB in one message")
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        data = buf.getvalue()
        self._size += len(data)
        self.blobs.append(data)
        return len(self.blobs) - 1


def _is_tensor(value) -> bool:
    torch = _torch_if_loaded()
    return torch is not None and isinstance(value, torch.Tensor)


def _torch_if_loaded():
    import sys
    return sys.modules.get("torch")


class MessageDecoder:
    """Rebuilds values from what :class:`MessageEncoder` wrote, checking every tag and limit.

    ``on_handle(obj) -> value`` turns a ``{"handle": ...}`` or ``{"ref": ...}`` object into a
    value (a proxy on the grader's side, the real object on the runner's); without it those
    raise :class:`ProtocolError`.
    """

    def __init__(self, blobs: list[bytes], on_handle: Callable[[dict], Any] | None = None):
        self._blobs = blobs
        self._on_handle = on_handle
        self._items = 0
        self._used: set[int] = set()   # each blob is decoded once: see _array

    def decode(self, obj: Any, depth: int = 0) -> Any:
        self._items += 1
        if self._items > MAX_ITEMS:
            raise ProtocolError(f"more than {MAX_ITEMS:,} values in one message")
        if depth > MAX_DEPTH:
            raise ProtocolError(f"nested more than {MAX_DEPTH} levels deep")
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, list):
            return [self.decode(v, depth + 1) for v in obj]
        if not isinstance(obj, dict) or len(obj) == 0:
            raise ProtocolError(f"unexpected {type(obj).__name__} in a message")
        tag = next(iter(obj))
        if tag not in _TAGS:
            raise ProtocolError(f"unknown tag {str(tag)[:40]!r}")
        body = obj[tag]
        if tag == "tuple":
            return tuple(self.decode(v, depth + 1) for v in self._list(body))
        if tag == "dict":
            out = {}
            for pair in self._list(body):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ProtocolError("a dict entry is not a [key, value] pair")
                key = self.decode(pair[0], depth + 1)
                try:
                    out[key] = self.decode(pair[1], depth + 1)
                except TypeError:
                    raise ProtocolError(f"unhashable dict key {type(key).__name__}") from None
            return out
        if tag == "float":
            if body not in ("nan", "inf", "-inf"):
                raise ProtocolError(f"bad float {str(body)[:20]!r}")
            return float(body)
        if tag == "ndarray":
            return self._array(body)
        if tag == "npscalar":
            arr = self._array(body)
            if arr.ndim != 0:
                raise ProtocolError("a NumPy scalar that is not 0-d")
            return arr[()]
        if tag == "tensor":
            return self._tensor(self._array(body), obj.get("dtype"))
        if tag == "given":
            data = self.decode(obj.get("data"), depth + 1)
            if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
                raise ProtocolError("given(...) data is not a dict of names")
            try:
                return Given(str(body), **data)
            except KeyError as err:
                raise ProtocolError(str(err)) from None
        if self._on_handle is None:
            raise ProtocolError(f"a {tag} cannot be decoded here")
        return self._on_handle(obj)

    @staticmethod
    def _list(body):
        if not isinstance(body, list):
            raise ProtocolError("expected a list")
        return body

    def _array(self, index) -> np.ndarray:
        if not isinstance(index, int) or isinstance(index, bool) or \
                not 0 <= index < len(self._blobs):
            raise ProtocolError(f"bad array index {str(index)[:20]}")
        if index in self._used:   # one blob named a million times would be a million arrays:
            # the message limits bound what a reply holds only if each blob is decoded once
            raise ProtocolError(f"array {index} used twice in one message")
        self._used.add(index)
        try:
            arr = np.load(io.BytesIO(self._blobs[index]), allow_pickle=False)
        except Exception as err:  # noqa: BLE001 - any malformed .npy is a protocol error
            raise ProtocolError(f"not a valid .npy array ({type(err).__name__})") from None
        if not isinstance(arr, np.ndarray) or arr.dtype.hasobject:
            raise ProtocolError("an array of Python objects")
        if arr.dtype.kind not in ARRAY_KINDS or arr.dtype.fields is not None or \
                arr.dtype.subdtype is not None:
            raise ProtocolError(f"an array of dtype {str(arr.dtype)[:40]} (only numbers, bytes "
                                f"and str cross)")
        if arr.dtype.itemsize < 1:   # 250 million elements of 0 bytes each travel in 200 bytes
            raise ProtocolError(f"an array of dtype {str(arr.dtype)[:40]}, {arr.dtype.itemsize} "
                                f"bytes an element")
        elements = 1
        for n in arr.shape:          # (0, 10**9, 10**9): no data, but a shape a check may use
            elements *= max(int(n), 1)
        if elements > max(len(self._blobs[index]), 1):
            raise ProtocolError(f"an array of shape {str(arr.shape)[:60]} in "
                                f"{len(self._blobs[index]):,} bytes")
        return arr

    @staticmethod
    def _tensor(arr: np.ndarray, dtype):
        if dtype not in TORCH_DTYPES:
            raise ProtocolError(f"tensor dtype {str(dtype)[:30]!r} is not allowed")
        travels = "float32" if dtype == "bfloat16" else dtype
        if arr.dtype != np.dtype(travels):   # no widening on arrival (int8 bytes sent as
            # complex128 would take 16 times the memory the message limits allow)
            raise ProtocolError(f"a {str(dtype)[:30]} tensor sent as {arr.dtype} bytes")
        import torch
        t = torch.from_numpy(np.require(arr, requirements="C"))  # (ascontiguousarray makes 0-d 1-d)
        return t.to(getattr(torch, dtype))


# ---- framing ------------------------------------------------------------------------------------

def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


class Channel:
    """One end of the grader-runner connection: ``send`` and ``recv`` whole messages.

    ``recv`` and ``send`` take an optional ``deadline`` (a ``time.monotonic()`` value): past it
    they raise :class:`TimeoutError`. The other side closing its end raises ``EOFError``; a
    message that breaks the format raises :class:`ProtocolError`.
    """

    def __init__(self, read_fd: int, write_fd: int, nonblocking: bool = False,
                 max_json: int = MAX_JSON_BYTES):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.max_json = min(int(max_json), MAX_JSON_BYTES)
        if nonblocking:  # writes then never block past a deadline
            os.set_blocking(write_fd, False)

    def send(self, message: dict, blobs: list[bytes] = (), deadline: float | None = None) -> None:
        try:
            header = json.dumps({"m": message, "b": [len(b) for b in blobs]}, allow_nan=False,
                                separators=(",", ":")).encode("utf-8")
        except (ValueError, TypeError, RecursionError) as err:
            raise ProtocolError(f"cannot write the message ({err})"[:200]) from None
        if len(header) > MAX_JSON_BYTES or sum(map(len, blobs)) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message larger than {MAX_MESSAGE_BYTES >> 20} MiB")
        self._write_all(_HEADER.pack(len(header)) + header, deadline)
        for blob in blobs:
            self._write_all(blob, deadline)

    def recv(self, deadline: float | None = None) -> tuple[dict, list[bytes]]:
        (length,) = _HEADER.unpack(self._read_exact(_HEADER.size, deadline))
        if length > self.max_json:
            raise ProtocolError(f"a message header of {length:,} bytes")
        raw = self._read_exact(length, deadline)
        if raw.count(b"{") + raw.count(b"[") > MAX_CONTAINERS:   # before json.loads builds them
            raise ProtocolError(f"more than {MAX_CONTAINERS:,} objects and lists in one message")
        try:
            envelope = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:
            raise ProtocolError(f"not JSON ({type(err).__name__})") from None
        if not isinstance(envelope, dict) or not isinstance(envelope.get("m"), dict) or \
                not isinstance(envelope.get("b"), list):
            raise ProtocolError("not a message")
        sizes = envelope["b"]
        if len(sizes) > MAX_BLOBS or not all(isinstance(n, int) and not isinstance(n, bool)
                                             and n >= 0 for n in sizes):
            raise ProtocolError("bad array sizes")
        if sum(sizes) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"arrays of {sum(sizes):,} bytes in one message")
        blobs = [self._read_exact(n, deadline) for n in sizes]
        return envelope["m"], blobs

    def _read_exact(self, n: int, deadline: float | None) -> bytes:
        chunks, got = [], 0
        while got < n:
            self._wait(self.read_fd, select.POLLIN, deadline)
            chunk = os.read(self.read_fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError("the other side closed the connection")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _write_all(self, data: bytes, deadline: float | None) -> None:
        view = memoryview(data)
        while view:
            self._wait(self.write_fd, select.POLLOUT, deadline)
            try:
                n = os.write(self.write_fd, view[: 1 << 16])
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise EOFError("the other side closed the connection") from None
            view = view[n:]

    @staticmethod
    def _wait(fd: int, event: int, deadline: float | None) -> None:
        poller = select.poll()
        poller.register(fd, event | select.POLLHUP | select.POLLERR)
        while True:
            left = _remaining(deadline)
            if left is not None and left <= 0:
                raise TimeoutError
            ready = poller.poll(None if left is None else max(1, int(left * 1000)))
            if ready:
                return
