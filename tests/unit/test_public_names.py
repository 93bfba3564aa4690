"""The documented public Python names keep working after the package moved to daemon/edgeinfer/ (issue 24):
`from edgeinfer import ring` and `edgeinfer.payloads` (docs/abi.md, README), `python -m
edgeinfer.producers.avdecode` (docs/operations.md: the RTSP decoder child's command), and the CLI's entry
points (`python -m edgeinfer.cli`, `from edgeinfer.cli import edgeinferd_main`)."""
import subprocess
import sys


def test_edgeinfer_ring_is_the_abi_ring_module():
    from edgeinfer import ring
    from edgeinfer.abi import ring as abi_ring
    assert ring is abi_ring
    for name in ("FrameWriter", "FrameReader", "ResultWriter", "ResultReader", "RingError", "transient",
                 "frame_bytes", "INGRESS_SOCKET", "RESULTS_SOCKET"):
        assert hasattr(ring, name), name
    import edgeinfer.ring
    assert edgeinfer.ring is abi_ring


def test_edgeinfer_payloads_is_the_abi_payloads_module():
    from edgeinfer import payloads
    from edgeinfer.abi import payloads as abi_payloads
    assert payloads is abi_payloads
    assert callable(payloads.describe) and callable(payloads.tensors)


def test_the_decoder_child_runs_by_its_documented_name():
    r = subprocess.run([sys.executable, "-m", "edgeinfer.producers.avdecode", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "python -m edgeinfer.producers.avdecode" in r.stdout


def test_the_cli_entry_points():
    from edgeinfer.cli import edgeinferctl_main, edgeinferd_main
    from edgeinfer.cli import main
    assert edgeinferd_main is main.edgeinferd_main and edgeinferctl_main is main.edgeinferctl_main
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "edgeinferctl" in r.stdout, r.stderr
