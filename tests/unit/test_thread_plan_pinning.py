"""ONNX Runtime's extra pool threads are pinned by inheritance (ThreadPlan.building), not by ORT's own option,
whose pool threads pin themselves by tid, which a lane's seccomp filter refuses (decision 0033)."""
from __future__ import annotations

import os

import numpy as np
import onnx.helper as h
import pytest

from edgeinfer.models.runtime import ThreadPlan


def _cpus_of(tid: str) -> str:
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list"))


def test_the_extra_threads_are_born_on_their_cpus_and_the_caller_keeps_its_own():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("pinning an extra thread apart needs two CPUs")
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", 1, [1 << 16])],
                     [h.make_tensor_value_info("y", 1, [1 << 16])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    own = os.sched_getaffinity(0)
    before = set(os.listdir("/proc/self/task"))
    sess = ThreadPlan(2, (cpus[-1],)).session(model.SerializeToString())
    sess.run(None, {"x": np.ones(1 << 16, np.float32)})
    born = sorted(set(os.listdir("/proc/self/task")) - before)
    assert born, "ORT started no pool thread"
    assert {_cpus_of(t) for t in born} == {str(cpus[-1])}
    assert os.sched_getaffinity(0) == own
