"""Bad input: fuzzed rings (in a child process: a crash must be seen, not
suffered), fuzzed configuration files, and damaged model bundles."""
from __future__ import annotations

import grp
import json
import os
import pwd
import random
import re
import shutil
import subprocess
import sys

from conftest import ROOT
from reliability_matrix import COUNTS

HERE = os.path.dirname(os.path.abspath(__file__))


def test_fuzzed_rings_never_crash_a_reader(request, matrix):
    """fuzz_segments.py in a child process: mutated frame rings handed to ring.FrameReader and
    result rings to ResultReader.from_fd, each as a sealed memfd, some rewritten while attached."""
    n = COUNTS["fuzz_segments"]
    r = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_segments.py"), str(n), "20261122"],
                       capture_output=True, text=True, timeout=1800)
    report = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else {}
    counts = report.get("counts", {})
    delivered = counts.get("frame:delivered", 0) + counts.get("record:read", 0)
    refused = sum(v for k, v in counts.items() if k.startswith("refused:"))
    skipped = sum(v for k, v in counts.items() if k.endswith(("CorruptFrame", "CorruptRing", ":short")))
    observed = (f"exit {r.returncode}{' ' + r.stderr.strip().splitlines()[-1][:120] if r.returncode else ''}; "
                f"{refused:,} refused at attach (typed errors), {skipped:,} frames/records refused by bounds checks, "
                f"{delivered:,} delivered with every byte inside the mapping; uncaught: "
                f"{report.get('uncaught') or 0}")
    passed = r.returncode == 0 and report.get("inputs") == n and not report.get("uncaught")
    assert matrix.record(request, "bad input", "fuzzed frame and result rings (sealed memfds): header fields, "
                         "slot/record metadata, latest/published/head, length; before and after attach", n,
                         "0 crashes, 0 hangs, every refusal a typed RingError", observed, passed)


# ------------------------------------------------------------------ config files

_CLEAR = re.compile(r"^fuzz\.yaml:\d+: (not valid YAML: |\S.*?: )")  # file:line: key: reason
_VALUES = ["-1", "0", "1e309", "99999999999999999999", "''", "null", "[]", "{}", "[1, [2]]", "yes", "'x' ",
           "\"\\u0000\"", "fifo", "0.0.0.0:99999", "/dev/null", "-0.5", "&a 1", "*a", "!!python/object:os.system x",
           "{a: {b: {c: 1}}}", "'" + "A" * 5000 + "'"]


def _mutate_config(rng: random.Random, lines: list[str]) -> str:
    lines = list(lines)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        kind = rng.randrange(7)
        line = lines[i]
        if kind <= 1 and ":" in line:  # a value replaced
            key = line.split(":", 1)[0]
            lines[i] = f"{key}: {rng.choice(_VALUES)}"
        elif kind == 2:  # a line dropped
            del lines[i]
        elif kind == 3:  # a line duplicated (a repeated key, or a repeated list item)
            lines.insert(i, line)
        elif kind == 4:  # an unknown key
            indent = line[: len(line) - len(line.lstrip())]
            lines.insert(i, f"{indent}{rng.choice(['bogus', 'max_age', 'Priority', 'streams'])}: 1")
        elif kind == 5:  # indentation broken
            lines[i] = " " * rng.choice([1, 3, 5]) + line.lstrip()
        elif line:  # a byte changed
            j = rng.randrange(len(line))
            lines[i] = line[:j] + chr(rng.choice([0x3a, 0x2d, 0x5b, 0x7b, 0x22, 0x09, 0x23, 0x26, 0x2a])) + line[j + 1:]
        if not lines:
            break
    return "\n".join(lines) + "\n"


def test_fuzzed_config_files_give_key_and_line(request, matrix):
    from edgeinfer.config.schema import Config
    from edgeinfer.support.yamlconf import ConfigError, load_yaml_model
    n = COUNTS["fuzz_configs"]
    template = (ROOT / "etc/edgeinfer/edgeinferd.yaml").read_text()
    template = template.replace("model:\n", "model:\n  bundle: /x\n", 1) if "  bundle:" not in template else template
    # The shipped file names user and group edgeinfer (the package creates them; names are resolved at load):
    # here they are this process's own, so that the unmutated template is valid and mutations start from a
    # valid file.
    here, me = grp.getgrgid(os.getgid()).gr_name, pwd.getpwuid(os.getuid()).pw_name
    template = template.replace("group: edgeinfer", f"group: {here}").replace("[edgeinfer]", f"[{here}]")
    template = template.replace("user: edgeinfer", f"user: {me}")
    load_yaml_model(Config, template, "template.yaml")
    lines = template.splitlines()
    rng = random.Random(20261122)
    accepted = clear = 0
    unclear: list[str] = []
    for _ in range(n):
        text = _mutate_config(rng, lines)
        try:
            load_yaml_model(Config, text, "fuzz.yaml")
            accepted += 1
        except ConfigError as e:
            if e.problems and all(_CLEAR.match(p) for p in e.problems):
                clear += 1
            else:
                unclear.append(str(e)[:200])
        except Exception as e:  # anything else reaches the operator as a traceback
            unclear.append(f"{type(e).__name__}: {str(e)[:160]}")
    observed = (f"{accepted:,} still valid, {clear:,} refused with file:line: key: reason for every problem, "
                f"{len(unclear)} otherwise{': ' + unclear[0] if unclear else ''}")
    assert matrix.record(request, "bad input", "fuzzed edgeinferd.yaml: values, dropped/repeated/unknown keys, "
                         "indentation, bytes", n, "valid, or every problem named with its line and key",
                         observed, not unclear and clear > n // 2)


# ------------------------------------------------------------------ bundles

def test_damaged_bundles_are_refused_with_the_reason(request, matrix, tmp_path, signing_key):
    """Truncated and bit-flipped files, an oversized model.yaml, symlinks,
    subdirectories, path traversal: each refused, with its own reason."""
    import fault_models
    from edgeinfer.models.bundle import BundleError
    from edgeinfer.models.verify import TrustStore, load_verified_bundle, sign_bundle
    key, _, trust_dir = signing_key
    trust = TrustStore(trust_dir)
    good = fault_models.signed_bundle("checksum", tmp_path / "good", key, 16, 8)
    load_verified_bundle(good, trust)  # the undamaged bundle is accepted
    sig = next(f for f in os.listdir(good) if f not in ("model.onnx", "model.yaml"))
    rng = random.Random(20261122)
    cases: list[tuple[str, object, str]] = []  # (label, damage(dir), reason the refusal must give)

    def flip(name):
        def damage(d):
            p = os.path.join(d, name)
            b = bytearray(open(p, "rb").read())
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
            open(p, "wb").write(bytes(b))
        return damage

    def truncate(name):
        def damage(d):
            p = os.path.join(d, name)
            size = os.path.getsize(p)
            os.truncate(p, rng.randrange(size))
        return damage

    for _ in range(COUNTS["fuzz_bundle_flips"]):
        name = rng.choice(["model.onnx", "model.yaml"])
        cases.append((f"bit flip in {name}", flip(name), f"{name}: "))
        cases.append((f"truncated {name}", truncate(name), f"{name}: "))
        cases.append(("bit flip in the signature", flip(sig), "not a model-signing signature|"
                      "not signed by a trusted key|does not match"))
        cases.append(("truncated signature", truncate(sig), "not a model-signing signature"))

    def oversized(d):  # signed by the trusted key, but an absurd model.yaml
        with open(os.path.join(d, "model.yaml"), "a") as f:
            f.write("# " + "x" * (2 << 20) + "\n")
        sign_bundle(d, key)
    cases.append(("oversized model.yaml (2 MiB, validly signed)", oversized, "model.yaml: 2097"))

    def symlinked(d):
        outside = tmp_path / "outside.onnx"
        shutil.copy(os.path.join(d, "model.onnx"), outside)
        os.unlink(os.path.join(d, "model.onnx"))
        os.symlink(outside, os.path.join(d, "model.onnx"))
    cases.append(("model.onnx a symlink out of the bundle", symlinked, "model.onnx: is a symbolic link"))

    def traversal(d):  # the signed manifest rewritten to name a file outside the bundle
        import base64
        p = os.path.join(d, sig)
        doc = json.load(open(p))
        env = doc["dsseEnvelope"]
        payload = base64.b64decode(env["payload"]).replace(b'"name": "model.yaml"', b'"name": "../model.yaml"')
        assert b"../model.yaml" in payload
        env["payload"] = base64.b64encode(payload).decode()
        json.dump(doc, open(p, "w"))
    cases.append(("path traversal in the signed manifest", traversal, "not a model-signing signature|"
                  "does not match|not signed by a trusted key|missing"))

    def subdir(d):
        os.mkdir(os.path.join(d, "extra"))
    cases.append(("a subdirectory in the bundle", subdir, "extra: "))

    def added(d):
        open(os.path.join(d, "notes.txt"), "w").write("hi")
    cases.append(("a file added after signing", added, "notes.txt: not covered by the signature"))

    def unsigned(d):
        os.unlink(os.path.join(d, sig))
    cases.append(("signature removed", unsigned, "missing: the bundle is not signed"))

    refused_right, wrong = 0, []
    for i, (label, damage, reason) in enumerate(cases):
        d = str(tmp_path / f"case{i}")
        shutil.copytree(good, d, symlinks=True)
        damage(d)
        try:
            load_verified_bundle(d, trust)
            wrong.append(f"{label}: ACCEPTED")
        except BundleError as e:
            if re.search(reason, str(e)):
                refused_right += 1
            else:
                wrong.append(f"{label}: {str(e)[:160]}")
        except Exception as e:
            wrong.append(f"{label}: {type(e).__name__}: {str(e)[:160]}")
        shutil.rmtree(d)
    observed = f"{refused_right}/{len(cases)} refused with the expected reason" + \
        (f"; {len(wrong)} not: {wrong[:3]}" if wrong else "")
    assert matrix.record(request, "bad input", "damaged bundles: truncated / bit-flipped files and signature, "
                         "oversized model.yaml, symlink, subdirectory, manifest traversal, added file, unsigned",
                         len(cases), "100 % refused, each with its exact reason", observed, not wrong)


def _peak_rss(cmd: list[str], timeout: float = 120) -> tuple[int, str, int]:
    """Runs `cmd`; returns (exit status, stderr, its own peak RSS in bytes). Through the launcher of
    daemon_helpers.measured: forked from this test process, the command's ru_maxrss would be this process's
    RSS at the fork, not its own. Killed after `timeout` (a read that blocks on a FIFO fails the row)."""
    import tempfile
    from daemon_helpers import measured
    with tempfile.TemporaryDirectory() as d:
        rc, _, err, _, peak = measured(cmd, d, "cmd", timeout)()
        return rc, err, peak


def test_adversarial_bundles_are_refused_unread(request, matrix, tmp_path, signing_key, bundles):
    """Oversized (sparse) files at and past each size limit, unsigned and foreign-signed
    1 GiB models, a FIFO, a device node, symlinks to /dev/zero, thousands of entries, keys
    slipped into the trust store: each refused with its reason by `edgeinferctl model
    verify` (and a few by `edgeinferd --verify-only`), and no file is read whole: the
    verifying process's peak RSS stays within 32 MiB of verifying a small good bundle."""
    import stat as stat_mod

    from daemon_helpers import edgeinferd_args, sign_copy, write_config
    from edgeinfer.models.verify import generate_keys, sign_bundle
    GiB = 1 << 30
    key, _, trust = signing_key
    other_key, other_pub = generate_keys(str(tmp_path / "other"), "other")
    good = sign_copy("cls-tiny", tmp_path / "good", key)

    def grow(name: str, size: int):
        def damage(d):
            with open(os.path.join(d, name), "ab") as f:
                f.truncate(size)  # sparse: no disk, and no memory unless read
        return damage

    def both(*damages):
        def damage(d):
            for x in damages:
                x(d)
        return damage

    def unsign(d):
        os.unlink(os.path.join(d, "model.sig"))

    def resign(k):
        return lambda d: sign_bundle(d, k)

    def garbage_sig(d):
        open(os.path.join(d, "model.sig"), "w").write("{not a signature")

    def many_files(n, size):
        def damage(d):
            for i in range(n):
                with open(os.path.join(d, f"part{i:04}.bin"), "wb") as f:
                    f.truncate(size)
        return damage

    def special(kind):
        def damage(d):
            p = os.path.join(d, "model.onnx")
            os.unlink(p)
            if kind == "fifo":
                os.mkfifo(p)
            elif kind == "zero-device":
                os.mknod(p, 0o644 | stat_mod.S_IFCHR, os.makedev(1, 5))  # /dev/zero
            elif kind == "zero-link":
                os.symlink("/dev/zero", p)
            elif kind == "big-link":
                big = tmp_path / "outside.onnx"
                with open(big, "wb") as f:
                    f.truncate(GiB)
                os.symlink(big, p)
            elif kind == "dir":
                os.mkdir(p)
        return damage

    def slipped_trust(mode=None, link=False):
        """A trust store with the good key and `other`'s, the latter world-writable or a symlink."""
        def make(case_dir):
            t = tmp_path / f"trust-{os.path.basename(case_dir)}"
            t.mkdir(mode=0o755)
            shutil.copy(os.path.join(trust, "test.pub"), t / "test.pub")
            if link:
                os.symlink(other_pub, t / "other.pub")
            else:
                shutil.copy(other_pub, t / "other.pub")
                os.chmod(t / "other.pub", mode)
            return str(t)
        return make

    big_model = grow("model.onnx", GiB)
    limit = "larger than the {}-byte limit for {}"
    # (label, damage(dir), trust dir maker or None, reason the refusal must give, also via edgeinferd)
    cases = [
        ("unsigned, model.onnx 1 GiB (at its limit)", both(unsign, big_model), None,
         "model.sig: missing: the bundle is not signed", True),
        ("model.onnx 1 GiB + 1 byte", grow("model.onnx", GiB + 1), None,
         "model.onnx: 1073741825 bytes, " + limit.format(GiB, "model.onnx"), True),
        ("model.onnx 64 GiB", grow("model.onnx", 64 * GiB), None, r"model.onnx: 68719476736 bytes, larger", False),
        ("model.onnx 1 GiB signed by an untrusted key", both(resign(other_key), big_model), None,
         r"model.sig: not signed by a trusted key \(tried test.pub in ", True),
        ("model.onnx 1 GiB, garbage model.sig", both(garbage_sig, big_model), None,
         "model.sig: not a model-signing signature", False),
        ("model.onnx 1 GiB signed by a 0666 key in the trust store", both(resign(other_key), big_model),
         slipped_trust(0o666), r"other.pub: file mode 0o666 is writable by group or others", True),
        ("model.onnx 1 GiB signed by a symlinked key in the trust store", both(resign(other_key), big_model),
         slipped_trust(link=True), r"other.pub: a symbolic link; trust-store entries must be regular files", False),
        ("model.sig 1 GiB", grow("model.sig", GiB), None,
         "model.sig: 1073741824 bytes, " + limit.format(1 << 20, "model.sig"), False),
        ("model.yaml 1 GiB", grow("model.yaml", GiB), None, "model.yaml: 1073741824 bytes, " +
         limit.format(1 << 20, "model.yaml"), False),
        ("labels.txt 1 GiB (an extra file)", grow("labels.txt", GiB), None,
         "labels.txt: 1073741824 bytes, " + limit.format(16 << 20, "each other file"), False),
        ("model.onnx 1 GiB + 5 files of 16 MiB (over the bundle total)", both(big_model, many_files(5, 16 << 20)),
         None, r"more than 1140850688 bytes in all, the limit for a whole bundle", False),
        ("3000 empty files", many_files(3000, 0), None, r"3003 entries; a bundle holds at most 256 files", False),
        ("model.onnx a FIFO", special("fifo"), None, "model.onnx: not a regular file", False),
        ("model.onnx a symlink to /dev/zero", special("zero-link"), None, "model.onnx: is a symbolic link", False),
        ("model.onnx a symlink to a 1 GiB file", special("big-link"), None, "model.onnx: is a symbolic link", False),
        ("model.onnx a directory", special("dir"), None, "model.onnx: not a regular file", False),
    ]
    if os.geteuid() == 0:
        cases.append(("model.onnx a /dev/zero device node", special("zero-device"), None,
                      "model.onnx: not a regular file", True))

    ctl = [sys.executable, "-m", "edgeinfer.cli", "model", "verify"]
    rc, err, ctl_base = _peak_rss([*ctl, good, "--trust-dir", trust])
    assert rc == 0, err
    rc, err, daemon_base = _peak_rss(edgeinferd_args(write_config(tmp_path, good, [{"name": "b"}]), "--verify-only"))
    assert rc == 0, err
    slack = 32 << 20
    refused_right, worst, wrong = 0, 0, []
    runs = 0
    for i, (label, damage, make_trust, reason, via_daemon) in enumerate(cases):
        d = str(tmp_path / f"adv{i}")
        shutil.copytree(good, d)
        damage(d)
        t = make_trust(d) if make_trust else trust
        runs_here = [("edgeinferctl", [*ctl, d, "--trust-dir", t], ctl_base)]
        if via_daemon:
            cfg_dir = tmp_path / f"adv{i}-cfg"
            cfg_dir.mkdir()
            cfg = write_config(cfg_dir, d, [{"name": "b"}], trust_dir=t)
            runs_here.append(("edgeinferd", edgeinferd_args(cfg, "--verify-only"), daemon_base))
        for who, cmd, base in runs_here:
            runs += 1
            rc, err, peak = _peak_rss(cmd)
            worst = max(worst, peak - base)
            if rc != 1 or not re.search(reason, err):
                wrong.append(f"{label} ({who}): exit {rc}: {err.strip()[-200:]}")
            elif peak > base + slack:
                wrong.append(f"{label} ({who}): peak RSS {peak >> 20} MiB, {base >> 20} MiB for a good bundle")
            else:
                refused_right += 1
        shutil.rmtree(d)
    observed = (f"{refused_right}/{runs} refused with the expected reason within {slack >> 20} MiB of a good "
                f"bundle's peak RSS (edgeinferctl {ctl_base >> 20} MiB, edgeinferd {daemon_base >> 20} MiB; worst "
                f"+{max(worst, 0) >> 20} MiB)" + (f"; {len(wrong)} not: {wrong[:3]}" if wrong else ""))
    assert matrix.record(request, "bad input", "adversarial bundles: 1 GiB..64 GiB sparse files at and past each "
                         "size limit, unsigned / foreign-signed / garbage-signed 1 GiB models, keys slipped into "
                         "the trust store, FIFO, device node, symlinks to /dev/zero, 3000 entries; edgeinferctl "
                         "model verify and edgeinferd --verify-only", runs,
                         "100 % refused with the reason, no file read whole (peak RSS within 32 MiB of a good "
                         "bundle's)", observed, not wrong), observed
