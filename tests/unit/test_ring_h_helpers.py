"""ring.h's helpers as a vendor calls them (issue 22, defect 3): tests/native/ring_helpers_test.c, compiled
against ring.h alone with the flags the examples get, run as a real process against real memfds, futexes
and a Unix socket (the test plays the daemon's side of the handshake)."""
from __future__ import annotations

import subprocess

from conftest import ROOT, require_tool

CHECKS = ("frame_len", "publish", "buffer", "futex", "generation", "transient", "busy")


def test_the_helpers_check_lengths_report_truncation_return_status_codes_and_retry_busy_quickly(tmp_path):
    """Each line is one helper fix: publish refuses a payload_len that is not ei_frame_payload_len (nv12's
    row_stride x height included) and keeps the slot; a reader buffer too small is EI_ERR_BUFFER with the
    record's real length, not a silent cut; ei_futex_wait returns EI_OK / EI_ERR_TIMEOUT / EI_ERR_AGAIN /
    EI_ERR_SYS; generation counts the rings a process made; EI_ERR_SYS is transient only by its errno (ENOTDIR
    is tried once); BUSY is retried every 50 ms for 2 s, then with the doubling backoff (the program drives
    ei_ingress_step with its own clock: no timing is measured)."""
    cc = require_tool("cc")
    exe = tmp_path / "ring_helpers_test"
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "native/include"),
                    str(ROOT / "tests/native/ring_helpers_test.c"), "-o", str(exe)], check=True)
    r = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and [line.split()[1] for line in lines] == list(CHECKS) and \
        all(line.startswith("ok ") for line in lines), (r.returncode, r.stdout, r.stderr)
    assert lines[-1] == f"ok busy quick={2_000_000_000 // 50_000_000}", lines[-1]  # every 50 ms for 2 s


# docs/abi.md, "Frame length": a 640 x 480 frame of each format, packed
DOCUMENTED = {"gray8": 307_200, "rgb24": 921_600, "bgr24": 921_600, "rgba32": 1_228_800, "bgra32": 1_228_800,
              "nv12": 460_800, "i420": 460_800, "yuyv": 614_400}


def test_python_has_the_documented_frame_length_from_ring_h_alone():
    """ring.frame_bytes (the vendor's helper), a ring's own layout and the slot view the daemon hands the model
    (vocabulary.frame_shape) all give the documented length for every format: one rule, ring.h's."""
    from edgeinfer.abi import ring
    from edgeinfer.abi.vocabulary import FRAME_FORMATS, frame_height, frame_shape
    for fmt in FRAME_FORMATS:
        want = DOCUMENTED[fmt.partition(":")[0]]
        rows, width, bpp = frame_shape(fmt, 480, 640)
        with ring.FrameWriter.create(640, 480, fmt) as w:
            got = (ring.frame_bytes(fmt, 640, 480), w.layout["frame_bytes"], rows * width * bpp, w.begin().nbytes)
        assert got == (want,) * 4 and frame_height(fmt, rows) == 480, (fmt, got)
    assert ring.frame_bytes("bgr24", 640, 480, row_stride=2048) == 2048 * 480  # padded rows count whole
