"""The documented public Python names keep working after the package moved to daemon/edgeinfer/ (issue 24):
`from edgeinfer import ring` and `edgeinfer.payloads` (docs/abi.md, README), `python -m
edgeinfer.producers.avdecode` (the RTSP decoder child's old command, deprecated: removed in 0.4.0; the producer
launches `python -m edgeinfer.cameras.avdecode`), and the CLI's entry points (`python -m edgeinfer.cli`,
`from edgeinfer.cli import edgeinferd_main`)."""
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


def test_the_producer_launches_the_decoder_child_by_its_new_name():
    from edgeinfer.cameras.ffmpeg import FfmpegOptions, avdecode_args
    args = avdecode_args(FfmpegOptions(source="rtsp://127.0.0.1:8554/cam"))
    assert args[1:3] == ["-m", "edgeinfer.cameras.avdecode"], args
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cameras.avdecode", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "python -m edgeinfer.cameras.avdecode" in r.stdout


def test_the_decoder_childs_old_name_still_runs_until_its_removal_release():
    """A camera service started before an upgrade re-runs the child by its old name on its next reconnection."""
    from edgeinfer.producers import avdecode as old
    assert old.REMOVED_IN == "0.4.0" and "0.4.0" in old.__doc__
    r = subprocess.run([sys.executable, "-m", "edgeinfer.producers.avdecode", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "usage: python -m edgeinfer.cameras.avdecode" in r.stdout  # the same child


def test_the_cli_entry_points():
    from edgeinfer.cli import edgeinferctl_main, edgeinferd_main
    from edgeinfer.cli import main
    assert edgeinferd_main is main.edgeinferd_main and edgeinferctl_main is main.edgeinferctl_main
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "edgeinferctl" in r.stdout, r.stderr


def test_the_ring_api_is_its_modules_all():
    """`edgeinfer.ring`'s names are its `__all__`, built from its parts' own (`ringdefs`, `framewriter`,
    `daemonside`): ring.h's names are listed once, in ringdefs.__all__, and every public name ringdefs defines
    is in it. `from edgeinfer.ring import *` gives exactly that list."""
    import inspect
    from edgeinfer.abi import daemonside, framewriter, ring, ringdefs

    for module in (ring, ringdefs, framewriter, daemonside):
        assert len(module.__all__) == len(set(module.__all__)), module.__name__
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, (module.__name__, missing)
        assert set(ringdefs.__all__ if module is ring else module.__all__) <= set(ring.__all__), module.__name__
    defined = {n for n, v in vars(ringdefs).items() if not n.startswith("_") and not inspect.ismodule(v)
               and n not in ("annotations", "YUV_BASES", "yuv_format_name")}  # __future__, vocabulary's own
    assert defined == set(ringdefs.__all__)
    own = {n for n, v in vars(ring).items()
           if not n.startswith("_") and getattr(v, "__module__", None) == ring.__name__}
    assert own <= set(ring.__all__), own - set(ring.__all__)
    names: dict = {}
    exec("from edgeinfer.ring import *", names)
    assert set(names) - {"__builtins__"} == set(ring.__all__)
    for documented in ("FrameWriter", "FrameReader", "ResultWriter", "ResultReader", "ResultRecord", "RingError",
                       "DaemonUnavailable", "transient", "frame_bytes", "wait_any", "WaitSet", "Doorbell",
                       "INGRESS_SOCKET", "RESULTS_SOCKET"):
        assert documented in ring.__all__, documented
