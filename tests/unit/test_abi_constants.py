"""abi/constants.py restates ring.h's socket paths and stream-name rule in pure Python, so that `edgeinferd
--check-config` and `edgeinferctl --help` run without the compiled extension (issue 24). These hold each
restated constant equal to the native module's (ring.h's), and run both commands with the extension made
unimportable."""
import os
import subprocess
import sys

from hypothesis import given, settings, strategies as st

from edgeinfer import _ring
from edgeinfer.abi import constants

# In a child: edgeinfer._ring and edgeinfer._hist cannot be imported (as on a host whose build is missing).
BLOCK = """
import importlib.abc, sys
class _NoNative(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("edgeinfer._ring", "edgeinfer._hist"):
            raise ImportError(f"{name} blocked by the test")
sys.meta_path.insert(0, _NoNative())
"""


def _without_native(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_the_restated_constants_are_ring_h_s():
    assert constants.INGRESS_SOCKET == _ring.INGRESS_SOCKET
    assert constants.RESULTS_SOCKET == _ring.RESULTS_SOCKET
    assert constants.STREAM_NAME_MAX == _ring.STREAM_NAME_MAX
    assert constants.MAX_WAIT == _ring.MAX_WAIT


def test_the_payload_words_are_the_headers():
    """Every payload kind and tensor-descriptor number Python restates (abi/vocabulary.py) is abi.h's, as the
    native core exports them (offsetof and sizeof from the compiler, the enums from the header)."""
    from edgeinfer.abi import vocabulary as v
    assert {name: kind for kind, name in v.KIND_NAMES.items()} == _ring.PAYLOAD_KINDS
    assert (v.KIND_NONE, v.KIND_CLASSIFICATION, v.KIND_DETECTION, v.KIND_RAW, v.KIND_TENSORS) == tuple(
        _ring.PAYLOAD_KINDS[k] for k in ("none", "classification", "detection", "raw", "tensors"))
    assert {"size": v.TENSOR_DESC_SIZE, "name_len": v.TENSOR_NAME_BYTES, "max_dims": v.TENSOR_MAX_DIMS,
            "align": v.TENSOR_ALIGN, "index": v.TENSOR_INDEX_OFFSET, "dtype": v.TENSOR_DTYPE_OFFSET,
            "ndim": v.TENSOR_NDIM_OFFSET, "dims": v.TENSOR_DIMS_OFFSET} == _ring.TENSOR_DESC


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=70), st.from_regex(r"[A-Za-z0-9_-]{0,66}", fullmatch=True)))
def test_the_stream_name_rule_is_ring_h_s(name):
    assert constants.stream_name_ok(name) == _ring.stream_name_ok(name)


def test_the_edge_names():
    for name in ("a", "0", "a" * 64, "a" * 65, "", "-a", "_a", "a-_9", "a.b", "a b", "é", "a\x00"):
        assert constants.stream_name_ok(name) == _ring.stream_name_ok(name), name


def test_the_blocker_blocks():
    r = _without_native("import edgeinfer._ring")
    assert r.returncode != 0 and "blocked by the test" in r.stderr


def test_check_config_runs_without_the_extension(tmp_path):
    cfg = tmp_path / "edgeinferd.yaml"
    cfg.write_text(f"model:\n  bundle: {tmp_path}/bundle\nstreams:\n  - name: cam0\n"
                   f"    producer: {{user: {os.getuid()}}}\n"
                   f"ingress:\n  socket: {tmp_path}/ingress.sock\n  results_socket: {tmp_path}/results.sock\n")
    r = _without_native("from edgeinfer.cli import edgeinferd_main as m; sys.exit(m())", "--check-config",
                        "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{cfg}: OK"), r.stdout


def test_edgeinferctl_help_runs_without_the_extension():
    for args in (["--help"], ["results", "--help"], ["feed", "--help"], ["model", "--help"]):
        r = _without_native("from edgeinfer.cli import edgeinferctl_main as m; sys.exit(m())", *args)
        assert r.returncode == 0, (args, r.stderr)
        assert "usage: edgeinferctl" in r.stdout, (args, r.stdout)
