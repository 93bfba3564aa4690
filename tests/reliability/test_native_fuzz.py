"""Coverage-guided fuzzing of the C reader side of ABI 2 (ring.h): libFuzzer
with AddressSanitizer and UndefinedBehaviorSanitizer drives the frame and
result ring checks, the frame consumer (init + acquire on a buffer the fuzzer
controls, with `latest`/`published` rewritten between acquires), the result
reader (init + next, with `head` rewritten between reads) and the daemon's
check of a client's hello (tests/reliability/fuzz_ring.c), from seeds that are
real rings written by the real writers and real hellos. A separately instrumented build (clang source-based
coverage) replays the grown corpus and says how much of each reader function
the fuzzer reached, so a fuzzer that stopped reaching its target is a failure,
not a quiet pass."""
from __future__ import annotations

import os
import re
import struct
import subprocess

import pytest

from conftest import ROOT, require_tool
from fuzz_segments import templates
from reliability_matrix import COUNTS

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "fuzz_ring.c")
INCLUDE = str(ROOT / "native/include")
NATIVE = str(ROOT / "native")  # consumer.h: the daemon's frame consumer
# Where the reader functions are: ring.h's headers and the daemon's consumer.
HEADERS = [*map(str, sorted((ROOT / "native/include/edgeinfer").glob("*.h"))), str(ROOT / "native/consumer.h")]
# The functions a producer's bytes reach in a reader; each must be reached (line coverage) by the corpus.
READER_FUNCTIONS = ("ei_frame_ring_check", "ei_frame_layout_from_geometry", "ei_frame_consumer_init",
                    "ei_frame_consumer_acquire", "ei_result_ring_check", "ei_result_layout_make",
                    "ei_result_reader_init", "ei_result_reader_next", "ei_hello_check", "ei_stream_name_ok")
MIN_LINE_COVERAGE = 80.0  # per function; the short profile reaches 93-100 % (the rest: concurrency and syscall failures)


def _build(clang: str, out: str, flags: list[str]) -> None:
    r = subprocess.run([clang, "-std=gnu11", "-g", *flags, f"-I{INCLUDE}", f"-I{NATIVE}", HARNESS, "-o", out],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"building the fuzz target failed:\n{r.stderr}"


def _write_seeds(corpus: str) -> None:
    """Real rings from the real writers, bare and with scripts appended (frames: (`latest`, `published`)
    pairs; results: `head` words), and the hellos of a producer and a reader."""
    frame, result = templates()
    # newer; a bad slot; `latest` ahead of `published` (a lie); near 2^64; backwards
    script = [((7 << 8) | 1, 7), ((8 << 8) | 200, 8), ((9 << 8) | 3, 8), (2 ** 64 - 1, 2 ** 64 - 1), ((3 << 8) | 0, 9)]
    heads = [7, 2 ** 63, 3, 6 + 4 * 5, 0]

    def hello(role: int, name: bytes) -> bytes:  # ring.h: ei_hello
        return b"EIHELLO2" + struct.pack("<II", 2, role) + name.ljust(64, b"\0") + bytes(48)
    seeds = {"frame": frame, "result": result,
             "frame-latest-script": frame + b"".join(struct.pack("<QQ", *e) for e in script),
             "result-head-script": result + struct.pack(f"<{len(heads)}Q", *heads),
             "hello-producer": hello(1, b"cam0"), "hello-reader": hello(2, b"front-door_2")}
    os.makedirs(corpus)
    for name, data in seeds.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)


def _coverage(clang: str, work: str, corpus: str) -> dict[str, tuple[float, float]]:
    """(line %, branch %) per reader function over the corpus, from clang's source-based coverage."""
    binary, raw, data = (os.path.join(work, n) for n in ("fuzz_ring_cov", "cov.profraw", "cov.profdata"))
    _build(clang, binary, ["-O0", "-fsanitize=fuzzer", "-fprofile-instr-generate", "-fcoverage-mapping"])
    subprocess.run([binary, "-runs=0", corpus], env={**os.environ, "LLVM_PROFILE_FILE": raw}, capture_output=True,
                   timeout=600, check=True)
    subprocess.run([require_tool("llvm-profdata"), "merge", "-sparse", raw, "-o", data], check=True, timeout=120)
    report = subprocess.run([require_tool("llvm-cov"), "report", binary, f"-instr-profile={data}",
                             "-show-functions", *HEADERS],
                            capture_output=True, text=True, timeout=120, check=True).stdout
    found = {}
    for line in report.splitlines():
        cols = line.split()
        # Name Regions Miss Cover Lines Miss Cover Branches Miss Cover
        if cols and cols[0].split(":")[-1] in READER_FUNCTIONS and len(cols) == 10:
            found[cols[0].split(":")[-1]] = (float(cols[6].rstrip("%")), float(cols[9].rstrip("%")))
    return found


# ~34,000 inputs/s here; allow for a machine three times slower, plus the builds and the coverage replay.
@pytest.mark.timeout(max(600, COUNTS["fuzz_native"] / 10_000 + 300))
def test_native_ring_readers_under_coverage_guided_fuzzing(request, matrix, tmp_path):
    clang = require_tool("clang")
    n = COUNTS["fuzz_native"]
    work, corpus = str(tmp_path), str(tmp_path / "corpus")
    fuzzer = os.path.join(work, "fuzz_ring")
    _build(clang, fuzzer, ["-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined"])
    _write_seeds(corpus)
    # -timeout: one input running 10 s is a hang (a reader spinning on a lying header) and a failure.
    r = subprocess.run([fuzzer, f"-runs={n}", "-max_len=16384", "-timeout=10", "-seed=20261122",
                        "-print_final_stats=1", f"-artifact_prefix={work}/", corpus],
                       capture_output=True, text=True, timeout=3600, cwd=work)
    executed = int(m.group(1)) if (m := re.search(r"stat::number_of_executed_units:\s+(\d+)", r.stderr)) else 0
    edges = m.group(1) if (m := re.search(r"DONE\s+cov: (\d+)", r.stderr)) else "?"
    seconds = m.group(1) if (m := re.search(r"Done \d+ runs in (\d+) second", r.stderr)) else "?"
    faults = [x for x in r.stderr.splitlines() if x.startswith(("SUMMARY:", "==", "ERROR:")) or "runtime error" in x]
    artifacts = [f for f in os.listdir(work) if f.startswith(("crash-", "timeout-", "leak-", "oom-"))]
    coverage = _coverage(clang, work, corpus) if r.returncode == 0 else {}
    low = {f: c for f, c in coverage.items() if c[0] < MIN_LINE_COVERAGE}
    missing = [f for f in READER_FUNCTIONS if f not in coverage]
    observed = (f"exit {r.returncode}; {executed:,} inputs in {seconds} s, {edges} edges, corpus "
                f"{len(os.listdir(corpus))} inputs; sanitizer reports: {len(faults)}"
                + (f" ({faults[0][:160]}; reproducer {artifacts})" if faults or artifacts else "")
                + "; lines/branches reached: "
                + ", ".join(f"{f} {c[0]:.0f}/{c[1]:.0f} %" for f, c in coverage.items()))
    passed = r.returncode == 0 and executed == n and not faults and not artifacts and not low and not missing
    assert matrix.record(request, "bad input", "coverage-guided fuzzing of the C readers in ring.h (libFuzzer + "
                         "ASan + UBSan): frame/result ring checks, frame consumer init + acquire, result reader "
                         "init + next, lying latest/published/head, the daemon's hello check",
                         n, f"0 crashes, 0 sanitizer reports, 0 hangs; every reader function reached "
                         f"(≥ {MIN_LINE_COVERAGE:.0f} % of its lines)", observed, passed), \
        f"{observed}\n{r.stderr[-3000:]}"
