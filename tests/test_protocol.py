"""The grader-runner wire format (txlearn.course.grading.protocol): values survive a round trip
through a real pipe with their types; every limit and every malformed message is a ProtocolError."""

import json
import math
import os
import struct

import numpy as np
import pytest
import torch

from txlearn import learner_calls
from txlearn.checks import Given as ChecksGiven, given as checks_given
from txlearn.course.grading import protocol
from txlearn.course.grading.protocol import (Channel, MessageDecoder, MessageEncoder,
                                             ProtocolError)
from txlearn.learner_calls import given, local_forward_backward


def _round_trip(value, on_other=None, on_handle=None):
    r, w = os.pipe()
    try:
        enc = MessageEncoder(on_other=on_other)
        message = {"v": enc.encode(value)}
        Channel(r, w).send(message, enc.blobs)
        got, blobs = Channel(r, w).recv()
        return MessageDecoder(blobs, on_handle=on_handle).decode(got["v"])
    finally:
        os.close(r)
        os.close(w)


def test_values_keep_their_types():
    value = {"a": (1, 2.5, None, True, "x"), 3: [np.float32(1.5), np.int64(7), np.bool_(True)],
             ("k", 1): float("nan"), "inf": (float("inf"), -float("inf"))}
    got = _round_trip(value)
    assert got["a"] == (1, 2.5, None, True, "x") and isinstance(got["a"], tuple)
    assert type(got[3][0]) is np.float32 and got[3][0] == 1.5
    assert type(got[3][1]) is np.int64 and type(got[3][2]) is np.bool_
    assert math.isnan(got[("k", 1)]) and got["inf"] == (math.inf, -math.inf)


def test_arrays_and_tensors_keep_dtype_shape_and_values():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(2, 3)), rng.normal(size=(4,)).astype(np.float32)[::2],
              np.arange(6, dtype=np.int32).reshape(2, 3).T, np.array([True, False]),
              np.zeros((0, 5)), np.array(3.0)]
    for a in arrays:
        got = _round_trip(a)
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
    t = torch.randn(3, 4, dtype=torch.float64)
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.int64, torch.bool):
        src = t.to(dtype)
        got = _round_trip(src)
        assert isinstance(got, torch.Tensor) and got.dtype == dtype
        assert torch.equal(got, src)
    param = torch.nn.Parameter(torch.ones(2))
    assert torch.equal(_round_trip(param), torch.ones(2))


def test_given_is_rebuilt_from_kind_and_data():
    W = np.arange(6.0).reshape(2, 3)
    g = _round_trip(given("tanh_linear", W=W))
    x = np.array([[1.0, -1.0]])
    np.testing.assert_allclose(g(x), np.tanh(x @ W))
    tx = torch.tensor(x, dtype=torch.float32)
    torch.testing.assert_close(g(tx), torch.tanh(tx @ torch.tensor(W, dtype=torch.float32)))
    assert ChecksGiven is learner_calls.Given and checks_given is given  # re-exported by the checks
    with pytest.raises(KeyError, match="unknown given kind"):
        given("not a kind")


def test_objects_that_cannot_cross_need_a_handle():
    with pytest.raises(ProtocolError, match="function cannot cross"):
        MessageEncoder().encode(lambda x: x)
    with pytest.raises(ProtocolError, match="cannot cross"):
        MessageEncoder().encode(np.array([object()], dtype=object))
    kept = []
    got = _round_trip([print, 2], on_other=lambda v: kept.append(v) or {"handle": 1,
                                                                        "is_module": False},
                      on_handle=lambda obj: ("proxy", obj["handle"]))
    assert got == [("proxy", 1), 2] and kept == [print]
    with pytest.raises(ProtocolError, match="cannot be decoded"):
        MessageDecoder([]).decode({"handle": 1})


def test_limits_depth_items_and_size():
    deep = []
    for _ in range(protocol.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(ProtocolError, match="nested"):
        MessageEncoder().encode(deep)
    with pytest.raises(ProtocolError, match="nested"):
        MessageDecoder([]).decode(json.loads(json.dumps(deep)))
    with pytest.raises(ProtocolError, match="MiB"):
        MessageEncoder().encode(np.zeros(protocol.MAX_MESSAGE_BYTES // 8 + 1))
    with pytest.raises(ProtocolError, match="values in one message"):
        MessageDecoder([]).decode([0] * (protocol.MAX_ITEMS + 1))


@pytest.mark.parametrize("raw, match", [
    (struct.pack(">I", protocol.MAX_JSON_BYTES + 1), "header"),
    (struct.pack(">I", 9) + b"{not json", "not JSON"),
    (struct.pack(">I", 2) + b"[]", "not a message"),
    (struct.pack(">I", 17) + b'{"m":{},"b":[-1]}', "bad array sizes"),
])
def test_malformed_frames_are_protocol_errors(raw, match):
    r, w = os.pipe()
    os.write(w, raw)
    os.close(w)
    with pytest.raises(ProtocolError, match=match):
        Channel(r, -1).recv()
    os.close(r)


@pytest.mark.parametrize("obj, match", [
    ({"evil": 1}, "unknown tag"), ({"ndarray": 5}, "bad array index"),
    ({"float": "1e999"}, "bad float"), ({"tensor": 0, "dtype": "object"}, "not allowed"),
    ({"dict": [[[1], 2]]}, "unhashable"), ({"given": "linear", "data": [1]}, "not a dict"),
])
def test_malformed_values_are_protocol_errors(obj, match):
    blob = [b"\x93NUMPY garbage"] if "tensor" in obj else []
    with pytest.raises(ProtocolError, match=match if not blob else "not a valid .npy|not allowed"):
        MessageDecoder(blob).decode(obj)


def test_eof_and_deadline():
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(EOFError):
        Channel(r, -1).recv()
    os.close(r)
    r, w = os.pipe()
    import time
    with pytest.raises(TimeoutError):
        Channel(r, w).recv(deadline=time.monotonic() + 0.05)
    os.close(r)
    os.close(w)


def test_local_forward_backward_matches_autograd():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).double()
    x = np.random.default_rng(1).normal(size=(4, 3))
    g = np.ones((4, 2))
    out, grads = local_forward_backward(lin, (x,), {}, g)
    xt = torch.tensor(x, requires_grad=True)
    ref = lin(xt)
    ref.backward(torch.ones(4, 2, dtype=torch.float64))
    torch.testing.assert_close(out, ref.detach())
    np.testing.assert_allclose(grads["input 0"], xt.grad.numpy())
    np.testing.assert_allclose(grads["weight"], lin.weight.grad.numpy())


def test_zero_dimensional_tensors_and_arrays_keep_their_shape():
    # a loss is a 0-d tensor: np.ascontiguousarray would make it (1,)
    import torch
    for value in (torch.tensor(2.5), torch.tensor(3, dtype=torch.int64), np.array(1.5),
                  torch.tensor(1.0, dtype=torch.bfloat16)):
        back = _round_trip(value)
        assert tuple(back.shape) == () and type(back) is type(value), value
