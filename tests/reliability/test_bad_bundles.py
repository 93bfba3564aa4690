"""Bad bundles (issue 15): 1,000 damaged or adversarial bundles made from the real signed orientation
bundle (bad_bundles.py: 30 classes), each refused by the one set of checks with a reason naming the file,
none accepted, none hanging or crashing, and none of the oversized files read: the checking process's
read bytes (/proc/<pid>/io rchar) and peak RSS are measured per bundle.

All 1,000 go through bundlecheck.check_bundle in one child process (bundle_checker.py), for speed; a
sample covering every class also goes through `edgeinferctl model verify` and `edgeinferd --verify-only`
as a user types them, which must give the same message (the one-set-of-checks promise). Those two commands
(a second each, mostly their imports) run beside the batch child, one case at a time in a thread, while the
loop makes and checks the next bundles: nothing waits for them but the end."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import bad_bundles
from daemon_helpers import edgeinferd_args, measured, sign_copy, write_config
from rel_helpers import Lines
from reliability_matrix import COUNTS

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20261124
CASE_TIMEOUT_S = 60      # a FIFO opened blocking, or an endless read, would sit here: a hang, not a wait
READ_BOUND = 64 << 20    # bytes a check may read: the 6.5 MiB model about 3 times, never an oversized file
RSS_BOUND = 400 << 20    # peak RSS of a checking process (one oversized file read whole: 1 GiB and more)
MESSAGE_BOUND = 8192     # a refusal is a line or, for model.yaml, up to 20 problems


def vm_hwm(pid: int) -> int:
    """A live process's peak RSS in bytes (VmHWM: its own address space's, nothing inherited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024
    except (OSError, StopIteration):  # already gone: its answers' hwm_kib have its peaks
        return 0


class Checker:
    """bundle_checker.py in a child process; a hang or a crash is answered None and the child restarted."""

    def __init__(self):
        self.stderr = tempfile.TemporaryFile()
        self.proc = None
        self.peak_rss = 0  # the largest VmHWM of the children, read as each ended
        self._start()

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "bundle_checker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr)
        self.lines = Lines(self.proc)

    def check(self, path: str, trust: str, stage: str | None = None) -> dict | None:
        try:
            self.proc.stdin.write((json.dumps({"path": path, "trust": trust, "stage": stage}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self.lines.next(CASE_TIMEOUT_S)
        if line:
            return json.loads(line)
        self._end(kill=True)
        self._start()
        return None

    def _end(self, kill: bool = False):
        # The child's own high-water mark, read while it lives: its ru_maxrss would carry this test
        # process's RSS at the fork (Linux keeps it through exec), and this process is large by now. Each
        # check resets the mark (bundle_checker.py), and each answer reports it; this covers the time since
        # the last reset, so a check that hung while growing is seen too.
        self.peak_rss = max(self.peak_rss, vm_hwm(self.proc.pid))
        if kill:
            self.proc.kill()
        else:
            self.proc.stdin.close()
        os.wait4(self.proc.pid, 0)
        self.proc.stdout.close()
        if not self.proc.stdin.closed:
            self.proc.stdin.close()

    def close(self):
        if self.proc and self.proc.returncode is None:
            timer = threading.Timer(CASE_TIMEOUT_S, self.proc.kill)
            timer.start()
            try:
                self._end()
            finally:
                timer.cancel()
            self.proc.returncode = 0
        self.stderr.close()


def said(stderr: str, prog: str) -> str | None:
    """The refusal a command printed: from its first `PROG: ` line that is not a warning, to the end."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{prog}: ") and not line.startswith(f"{prog}: warning: "):
            return "\n".join([line[len(prog) + 2:], *lines[i + 1:]]).rstrip("\n")
    return None


def appender(path: str, stop: threading.Event) -> threading.Thread:
    """Appends to `path` until `stop` (at most 64 MiB): a file that keeps growing while it is checked."""
    def run():
        with open(path, "ab") as f:
            for _ in range(1024):
                if stop.is_set():
                    return
                f.write(b"\0" * (64 << 10))
                f.flush()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def make_context(root: str, signing_key) -> bad_bundles.Context:
    from edgeinfer.models.verify import generate_keys, sign_bundle
    key, _, _ = signing_key
    good = sign_copy("orientation", os.path.join(root, "good"), key)
    files = {}
    for name in sorted(os.listdir(good)):
        with open(os.path.join(good, name), "rb") as f:
            files[name] = f.read()
    untrusted_key, _ = generate_keys(os.path.join(root, "untrusted"), "untrusted")
    other = os.path.join(root, "untrusted-signed")
    shutil.copytree(good, other)
    os.unlink(os.path.join(other, "model.sig"))
    sign_bundle(other, untrusted_key)
    foreign = sign_copy("cls-tiny", os.path.join(root, "foreign"), key)
    outside = os.path.join(root, "outside")
    os.mkdir(outside)
    huge = os.path.join(outside, "huge.onnx")
    with open(huge, "wb") as f:
        f.truncate(2 << 30)
    with open(os.path.join(other, "model.sig"), "rb") as f, open(os.path.join(foreign, "model.sig"), "rb") as g, \
            open(os.path.join(foreign, "model.onnx"), "rb") as h:
        return bad_bundles.Context(good, files, key, untrusted_key, f.read(), g.read(), h.read(), outside, huge)


def sample_of(n: int) -> set:
    """(class, index) of `n` cases for the CLI and the daemon: every class once, then again, in order.
    Not the two classes that only the batch child can stage (a change timed to its checks)."""
    eligible = [(cls, count) for cls, count, make in bad_bundles.CLASSES
                if make not in (bad_bundles.changed_while_read, bad_bundles.growing_while_read)]
    picked, i = set(), 0
    while len(picked) < n and i < max(c for _, c in eligible):
        for cls, count in eligible:
            if i < count and len(picked) < n:
                picked.add((cls, i))
        i += 1
    return picked


def test_bad_bundles_are_refused_unread(request, matrix, signing_key, bundles):
    total, sample_n = COUNTS["bad_bundles"], COUNTS["bad_bundles_sample"]
    trust = signing_key[2]
    is_root = os.geteuid() == 0
    root = tempfile.mkdtemp(prefix="eib-", dir="/tmp")  # short paths: a unix socket's name must fit
    checker = None
    per_class: dict[str, list[int]] = {}  # class -> [made, refused right]
    wrong: list[str] = []
    skipped = {}
    max_rchar = max_oversized_rchar = max_hwm = 0
    biggest = 0
    cli = {"n": 0, "same": 0, "rchar": 0, "rss": 0}
    dmn = {"n": 0, "rchar": 0, "rss": 0}
    commands = ThreadPoolExecutor(max_workers=1)  # the sample through the commands, beside the batch child
    sampled = []  # (class, index, future: the problem or None), judged at the end
    try:
        ctx = make_context(root, signing_key)
        checker = Checker()
        control = checker.check(ctx.good, trust)
        model_size = len(ctx.files["model.onnx"])
        # The measurement sees a whole read: the good bundle's model is read (more than) once.
        assert control and control["accepted"] and control["rchar"] >= model_size, control
        ctl = [os.path.join(os.path.dirname(sys.executable), "edgeinferctl"), "model", "verify"]
        fin = measured([*ctl, ctx.good, "--trust-dir", trust], root, "control", CASE_TIMEOUT_S)()
        assert fin[0] == 0 and fin[3] >= model_size, fin
        cli_control_rchar = fin[3]
        sample = sample_of(sample_n)
        for n, (cls, i, make) in enumerate(bad_bundles.cases(total)):
            counts = per_class.setdefault(cls, [0, 0])
            if make is bad_bundles.device and not is_root:
                skipped[cls] = "mknod needs root"
                continue
            d = os.path.join(root, f"c{n:04}")
            bad_bundles.link_all(ctx, d)
            made = make(bad_bundles.rng_for(SEED, cls, i), ctx, d)
            counts[0] += 1
            biggest = max(biggest, made.oversized)
            stop = threading.Event()
            writer = appender(os.path.join(d, "model.onnx"), stop) if made.writer else None
            try:
                got = checker.check(d, trust, made.stage)
            finally:
                stop.set()
                if writer:
                    writer.join(CASE_TIMEOUT_S)
            problem = judge(got, made, d)
            if got:
                max_rchar = max(max_rchar, got["rchar"])
                max_hwm = max(max_hwm, got["hwm_kib"] << 10)
                if made.oversized:
                    max_oversized_rchar = max(max_oversized_rchar, got["rchar"])
            if not problem and (cls, i) in sample:
                # The bundle is left in place until its commands are done (their thread removes it).
                sampled.append((cls, i, commands.submit(through_the_commands, ctl, d, trust, got["message"], root,
                                                        n, cli, dmn)))
                continue
            if problem:
                wrong.append(f"{cls} #{i}: {problem}")
            else:
                counts[1] += 1
            shutil.rmtree(d)
        for cls, i, done in sampled:
            problem = done.result()
            if problem:
                wrong.append(f"{cls} #{i}: {problem}")
            else:
                per_class[cls][1] += 1
    finally:
        commands.shutdown(wait=True, cancel_futures=True)
        if checker:
            checker.close()
        shutil.rmtree(root, ignore_errors=True)
    made_n = sum(c[0] for c in per_class.values())
    refused = sum(c[1] for c in per_class.values())
    if checker and checker.peak_rss > RSS_BOUND:
        wrong.append(f"the batch child's peak RSS {checker.peak_rss >> 20} MiB")
    classes = "; ".join(f"{cls} {c[1]}/{c[0]}" for cls, c in per_class.items())
    observed = (f"{refused}/{made_n} refused with the reason naming the file, 0 accepted" if not wrong else
                f"{refused}/{made_n} refused right; {len(wrong)} not: {' | '.join(wrong[:3])}")
    observed += (f"; bytes read per check: max {max_rchar / 2**20:.1f} MiB (oversized cases: max "
                 f"{max_oversized_rchar / 2**10:.0f} KiB, the largest file {biggest / 2**30:.0f} GiB; the good "
                 f"bundle {control['rchar'] / 2**20:.1f} MiB), peak RSS per check max {max_hwm >> 20} MiB, of the "
                 f"child {checker.peak_rss >> 20} MiB; edgeinferctl model verify and edgeinferd --verify-only on "
                 f"{cli['n']} of them (every class): {cli['same']} the same message as the checks, rchar max "
                 f"{max(cli['rchar'], dmn['rchar']) / 2**20:.1f} MiB (a good bundle {cli_control_rchar / 2**20:.1f} "
                 f"MiB), peak RSS max {max(cli['rss'], dmn['rss']) >> 20} MiB; by class: {classes}"
                 + (f"; skipped: {skipped}" if skipped else ""))
    assert matrix.record(request, "bad input", "1,000 damaged or adversarial bundles from the signed orientation "
                         "bundle (30 classes: model.onnx/model.yaml/model.sig damaged before or after signing, YAML "
                         "bombs, untrusted and foreign signatures, extra files, symlinks, directories, FIFOs, "
                         "devices, sockets, 2,000 entries, sparse files to 1 TiB, files changing while read); "
                         "bundlecheck in a child, a sample through edgeinferctl and edgeinferd", made_n,
                         f"100 % refused, the reason naming the file, the same from CLI and daemon; no hang, no "
                         f"crash; no oversized file read (rchar < {READ_BOUND >> 20} MiB, peak RSS < "
                         f"{RSS_BOUND >> 20} MiB)", observed, not wrong), observed


def judge(got: dict | None, made: bad_bundles.Made, d: str) -> str | None:
    """Why the checks' answer for bundle `d` is not what the row expects; None if it is."""
    if got is None:
        return f"no answer within {CASE_TIMEOUT_S} s (hung or crashed)"
    if got["accepted"]:
        return "ACCEPTED"
    msg = got["message"] or ""
    if not got["refusal"]:
        return f"{got['type']} instead of a refusal: {msg[:200]}"
    shown = msg.replace(d, "BUNDLE")
    if not re.search(made.expect, shown):
        return f"{got['type']}: {shown[:300]!r} does not match {made.expect!r}"
    if len(msg) > MESSAGE_BOUND or len(msg.splitlines()[0]) > 1024:
        return f"a message of {len(msg)} characters: {msg[:120]!r}…"
    if got["rchar"] >= READ_BOUND or (made.oversized and got["rchar"] >= made.oversized // 2):
        return f"read {got['rchar']} bytes"
    if got["hwm_kib"] << 10 >= RSS_BOUND:
        return f"peak RSS {got['hwm_kib'] >> 10} MiB"
    return None


def through_the_commands(ctl, d, trust, message, root, n, cli, dmn) -> str | None:
    """`edgeinferctl model verify` and `edgeinferd --verify-only` on bundle `d`, side by side: each exits 1
    with `message`, reads less than READ_BOUND and peaks under RSS_BOUND. Removes `d` once they are done
    (run in the commands' thread: the only one that writes `cli` and `dmn`)."""
    cfg_dir = os.path.join(root, f"cfg{n}")
    os.mkdir(cfg_dir)
    from pathlib import Path
    cfg = write_config(Path(cfg_dir), d, [{"name": "b"}], trust_dir=trust, state_dir=os.path.join(cfg_dir, "state"))
    c = measured([*ctl, d, "--trust-dir", trust], cfg_dir, "ctl", CASE_TIMEOUT_S)
    e = measured(edgeinferd_args(cfg, "--verify-only"), cfg_dir, "daemon", CASE_TIMEOUT_S)
    try:
        c, e = c(), e()
    finally:
        shutil.rmtree(d)
        shutil.rmtree(cfg_dir)
    cli["n"] += 1
    dmn["n"] += 1
    for stats, (rc, _, _, rchar, rss) in ((cli, c), (dmn, e)):
        stats["rchar"], stats["rss"] = max(stats["rchar"], rchar), max(stats["rss"], rss)
    for who, (rc, _, err, rchar, rss), prog in (("edgeinferctl", c, "edgeinferctl"), ("edgeinferd", e, "edgeinferd")):
        if rc != 1:
            return f"{who} exit {rc}: {err.strip()[-300:]}"
        if said(err, prog) != message:
            return f"{who} said {said(err, prog)!r}, the checks {message!r}"
        if not 0 <= rchar < READ_BOUND or rss >= RSS_BOUND:
            return f"{who} read {rchar} bytes, peak RSS {rss >> 20} MiB"
    cli["same"] += 1
    return None
