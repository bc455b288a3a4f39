"""The checks' helpers (call, construct, state_shapes, load_state, forward_backward) on proxies
for objects in a sandboxed runner: what module exercises need, compared with the same helpers on
local objects (the oracle: the learner's kernel)."""

import os

import numpy as np
import pytest
import torch

from txlearn.checks import (CheckFailure, call, construct, forward_backward, given, load_state,
                            state_shapes)
from txlearn.course import build, grading
from txlearn.course.grading import sandbox, sets, submission, view
from txlearn.course.grading.session import Session

ANSWER = '''
import numpy as np
import torch
from torch import nn

class Lin(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(d_in, d_out, dtype=torch.float64))

    def forward(self, x):
        return x @ self.W

def apply(f, x):
    return f(x)

def scale_in_place(x):
    x *= 2.0
    return None

def make_adder(c):
    return lambda x: x + c

def use(module, x):
    return module(torch.as_tensor(x)) * 3

def half(x):
    return torch.as_tensor(x).to(torch.bfloat16)

def broken(x):
    return undefined_name + x
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runner")
    cs = sets.load_set(build.find_source("03_heads"))
    cs.view_modules = view.view_modules(cs)
    cs.view_dir = str(tmp / "view")
    view.make_view(tmp / "view", cs.view_modules)
    cells = [submission.Cell(0, ANSWER, "", "setup cell 1")]
    limits = dict(cs.info.limits, call_seconds=20)
    mode = grading.sandbox_modes([tmp / "x.ipynb"])[0]
    lease = sandbox.UidLease() if mode == "bwrap" and os.geteuid() == 0 else None
    s = Session(cs, cells, limits, mode, [], lease.uid if lease else None)
    s.boot()
    yield s
    s.close()
    if lease:
        lease.release()


def _local():
    namespace = {}
    exec(ANSWER, namespace)
    return namespace


def test_a_module_built_loaded_run_and_differentiated_in_the_sandbox(session):
    local = _local()
    rng = np.random.default_rng(0)
    W, x, g = rng.normal(size=(3, 2)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    results = []
    for Lin in (session.proxy("Lin"), local["Lin"]):
        m = construct(Lin, 3, 2, case="build")
        shapes = state_shapes(m, case="shapes")
        load_state(m, {"W": W}, case="load")
        out = call(m, torch.tensor(x), case="forward")
        out2, grads = forward_backward(m, x, grad_output=g, case="backward")
        results.append((shapes, out, out2, grads))
    (shapes, out, out2, grads), (shapes_l, out_l, out2_l, grads_l) = results
    assert shapes == shapes_l == {"W": (3, 2)}
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    torch.testing.assert_close(out, out_l)
    torch.testing.assert_close(out2, out2_l)
    np.testing.assert_allclose(grads["W"], x.T @ g)
    np.testing.assert_allclose(grads["input 0"], g @ W.T)
    assert set(grads) == set(grads_l)


def test_given_callables_handles_and_arguments_changed_in_place(session):
    W = np.arange(6.0).reshape(3, 2)
    x = np.ones((2, 3))
    got = call(session.proxy("apply"), given("linear", W=W), x, case="given")
    np.testing.assert_allclose(got, x @ W)
    y = np.arange(3.0)
    with pytest.raises(CheckFailure, match="changed its input number 1 in place"):
        call(session.proxy("scale_in_place"), y, case="in place")
    np.testing.assert_array_equal(y, [0.0, 1.0, 2.0])   # the check's own array is untouched
    adder = call(session.proxy("make_adder"), 5, case="closure")
    assert type(adder).__name__ == "function" and not adder.remote_is_module()
    assert call(adder, 1, case="call the handle") == 6
    m = construct(session.proxy("Lin"), 3, 2, case="build")
    load_state(m, {"W": W}, case="load")
    np.testing.assert_allclose(call(session.proxy("use"), m, x, case="a handle as argument"),
                               3 * x @ W)
    half = call(session.proxy("half"), np.array([1.5, 2.0]), case="bf16")
    assert half.dtype == torch.bfloat16 and half.tolist() == [1.5, 2.0]


def test_the_learners_exception_comes_back_with_their_frame(session):
    with pytest.raises(CheckFailure) as info:
        call(session.proxy("broken"), 1, case="raises")
    text = str(info.value)
    assert "raised NameError: name 'undefined_name' is not defined" in text
    assert "in broken: return undefined_name + x" in text
    with pytest.raises(CheckFailure, match="state-dict names|has no V"):
        load_state(construct(session.proxy("Lin"), 3, 2, case="b"), {"V": np.ones(2)}, case="l")


@pytest.mark.parametrize("source,forbidden", [
    ("08_complexity", "txlearn.flash_attention"),     # set 08's answers live in four modules
    ("08_complexity", "txlearn.counting"),
    ("09_capstone", "txlearn.sampling"),
    ("10_decoder", "txlearn.models.llama"),
    ("02_attention", "txlearn.attention"),
])
def test_a_view_never_holds_the_module_that_answers_the_set(source, forbidden):
    cs = sets.load_set(build.find_source(source))
    assert forbidden not in view.view_modules(cs)
    cs.allowed = [*cs.allowed, forbidden]
    with pytest.raises(sets.GradingError, match="implements its own exercises"):
        view.view_modules(cs)
