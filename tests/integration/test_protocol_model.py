"""Model checking of the claim protocol (tests/model/claim.pml) with spin.

The model is checked exhaustively, and so are two mutants: one without the
Dekker re-check (spin must find the torn read) and one whose producer stores
`latest` before `published` (spin must find the consumer's "ran ahead" check
firing on an honest producer). Each shows the model can see the bug its rule
prevents."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path


from conftest import require_tool

MODEL = Path(__file__).parent.parent / "model" / "claim.pml"


def run_spin(model_text: str, workdir: Path, liveness: bool) -> str:
    spin = require_tool("spin")
    cc = require_tool("cc")
    (workdir / "model.pml").write_text(model_text)
    subprocess.run([spin, "-a", "model.pml"], cwd=workdir, check=True, capture_output=True, timeout=120)
    defines = [] if liveness else ["-DSAFETY", "-DNOCLAIM"]
    subprocess.run([cc, "-w", "-O2", *defines, "-o", "pan", "pan.c"], cwd=workdir, check=True, timeout=300)
    args = ["./pan", "-m200000"] + (["-a", "-f"] if liveness else [])
    out = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=600).stdout
    return out


def errors(out: str) -> int:
    m = re.search(r"errors: (\d+)", out)
    assert m, f"spin printed no verdict:\n{out}"
    return int(m.group(1))


def test_claim_protocol_is_safe_in_every_interleaving(tmp_path):
    out = run_spin(MODEL.read_text(), tmp_path, liveness=False)
    assert errors(out) == 0, out
    assert "assertion violations\t+" in out and "invalid end states\t+" in out
    assert "search was not completed" not in out  # the whole state space was explored


def test_consumer_always_ends_with_the_newest_frame(tmp_path):
    out = run_spin(MODEL.read_text(), tmp_path, liveness=True)
    assert errors(out) == 0, out
    assert "acceptance   cycles \t+ (fairness enabled)" in out


def test_model_catches_a_missing_claim_recheck(tmp_path):
    text = MODEL.read_text()
    start = text.index(":: claimed == s ->")
    end = text.index(":: else -> skip", start)
    mutant = text[:start] + text[end:]
    assert mutant != text
    out = run_spin(mutant, tmp_path, liveness=False)
    assert errors(out) >= 1
    assert "assertion violated ((a==q)&&(b==q))" in out, out


def test_model_catches_latest_stored_before_published(tmp_path):
    """ABI 2's rule: `published` is stored before `latest`, so `seq > published` is never a race."""
    text = MODEL.read_text()
    publish = "        published = seq;                               /* store published */\n"
    latest = "        atomic { latest_seq = seq; latest_slot = s }   /* store latest */\n"
    assert publish + latest in text
    mutant = text.replace(publish + latest, latest + publish)
    out = run_spin(mutant, tmp_path, liveness=False)
    assert errors(out) >= 1
    assert "assertion violated (q<=p)" in out, out
