"""The child process of the bad-bundles row (test_bad_bundles.py): checks bundles one at a time with
bundlecheck.check_bundle, the one set of checks that edgeinferd and `edgeinferctl model verify` run, and
answers for each what the checks said and what checking it cost this process: the bytes it read through
system calls (/proc/self/io rchar; a file read whole is there byte for byte, sparse or not) and its peak
RSS (VmHWM, reset before each bundle). A child, so that a crash or a hang is seen, not suffered.

stdin, one JSON object a line: {"path": BUNDLE, "trust": DIR, "stage": null | "grow" | "grow-64g" | "shrink"}
stdout, one JSON object a line: {"accepted": bool, "refusal": bool, "type": ..., "message": ...,
"rchar": bytes, "hwm_kib": KiB}. "stage" changes model.onnx after its size was checked, before it is read.
"""
from __future__ import annotations

import json
import os
import sys


def rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def peak_rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])


def staged(kind: str | None, path: str):
    """A replacement for OpenBundle._open_entries that changes model.onnx once every size is checked
    (the test gave this bundle its own copy of the file), or None."""
    from edgeinfer.models.bundle import OpenBundle
    real = OpenBundle._open_entries
    if kind is None:
        return real
    model = os.path.join(path, "model.onnx")

    def open_then_change(self, dfd):
        real(self, dfd)
        size = os.path.getsize(model)
        if kind == "grow":
            with open(model, "ab") as f:
                f.write(b"\0")
        elif kind == "grow-64g":
            os.truncate(model, size + (64 << 30))  # sparse: a reader that did not stop would read 64 GiB
        elif kind == "shrink":
            os.truncate(model, size // 2)
    return open_then_change


def check(req: dict) -> dict:
    from edgeinfer.models.bundle import BundleError, OpenBundle
    from edgeinfer.models.check import check_bundle
    real = OpenBundle._open_entries
    OpenBundle._open_entries = staged(req.get("stage"), req["path"])
    reset_peak_rss()
    before = rchar()
    out = {"accepted": False, "refusal": False, "type": None, "message": None}
    try:
        check_bundle(req["path"], req["trust"])
        out["accepted"] = True
    except BundleError as e:
        out.update(refusal=True, type=type(e).__name__, message=str(e))
    except Exception as e:  # anything else is a failure of the row: reported, not raised
        out.update(type=type(e).__name__, message=str(e)[:2000])
    finally:
        OpenBundle._open_entries = real
    out["rchar"] = rchar() - before
    out["hwm_kib"] = peak_rss_kib()
    return out


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(check(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
