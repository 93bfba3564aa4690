"""Bad input: fuzzed rings (in a child process: a crash must be seen, not
suffered), fuzzed configuration files, and damaged model bundles."""
from __future__ import annotations

import grp
import json
import os
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
    from edgeinfer.config import Config
    from edgeinfer.yamlconf import ConfigError, load_yaml_model
    n = COUNTS["fuzz_configs"]
    template = (ROOT / "etc/edgeinfer/edgeinferd.yaml").read_text()
    template = template.replace("model:\n", "model:\n  bundle: /x\n", 1) if "  bundle:" not in template else template
    # The shipped file names group edgeinfer (the package creates it; names are resolved at load): here it is
    # this process's own group, so that the unmutated template is valid and mutations start from a valid file.
    here = grp.getgrgid(os.getgid()).gr_name
    template = template.replace("group: edgeinfer", f"group: {here}").replace("[edgeinfer]", f"[{here}]")
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
    from edgeinfer.bundle import BundleError
    from edgeinfer.signing import TrustStore, load_verified_bundle, sign_bundle
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
