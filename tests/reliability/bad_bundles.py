"""Damaged and adversarial model bundles for the bad-bundles row (test_bad_bundles.py), made from the real
signed orientation bundle. Each class makes one case in a fresh directory from its own seeded generator
(so any case can be made again alone) and says how the checks must refuse it: a regular expression over
the message, with the bundle's path written BUNDLE.

Files are hard links to the good bundle's until a case changes them, and a change always replaces the
link (put, sparse, resign): nothing here writes into a file another case shares."""
from __future__ import annotations

import dataclasses
import os
import random
import socket
import stat
from typing import Callable

import yaml

GiB, MiB = 1 << 30, 1 << 20
MODEL, META, SIG = "model.onnx", "model.yaml", "model.sig"

DIFFERS = r"^BUNDLE/{}: content differs from its signed sha256 \(tampered or replaced\)$"
INVALID = r"^BUNDLE/model\.yaml: invalid:\n  BUNDLE/model\.yaml:\d+: "
NOT_REGULAR = r"^BUNDLE/{}: not a regular file; a bundle holds only regular files$"
SYMLINK = r"^BUNDLE/{}: is a symbolic link; a bundle holds only regular files$"
OVER = r"^BUNDLE/{}: \d+ bytes, larger than the \d+-byte limit for "
CHANGED = r"^BUNDLE/model\.onnx: changed while being read \(\d+ bytes when opened, \d+\+? read\)$"


@dataclasses.dataclass
class Made:
    expect: str              # regular expression the refusal must match (BUNDLE: the bundle's path)
    stage: str | None = None  # bundle_checker.py changes model.onnx after the size check
    oversized: int = 0        # the largest file over its limit: the checks must not read it
    writer: bool = False      # the test appends to model.onnx while the checks run


@dataclasses.dataclass
class Context:
    good: str                 # the signed orientation bundle
    files: dict               # its files' bytes
    key: str                  # the trusted signing key
    untrusted_key: str
    untrusted_sig: bytes      # the good files, signed by the untrusted key
    foreign_sig: bytes        # another bundle's signature by the trusted key
    other_onnx: bytes         # another valid ONNX model
    outside: str              # a directory outside the bundle: symlink targets
    huge_outside: str         # a 2 GiB sparse file there


# ------------------------------------------------------------------ making files

def link_all(ctx: Context, d: str) -> None:
    os.mkdir(d)
    for name in ctx.files:
        os.link(os.path.join(ctx.good, name), os.path.join(d, name))


def _unlink(path: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)


def put(d: str, name: str, data: bytes) -> None:
    _unlink(os.path.join(d, name))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def sparse(d: str, name: str, size: int) -> None:
    _unlink(os.path.join(d, name))
    with open(os.path.join(d, name), "wb") as f:
        f.truncate(size)  # no disk, no memory: unless someone reads it


def resign(d: str, key: str) -> None:
    from edgeinfer.models.verify import sign_bundle
    _unlink(os.path.join(d, SIG))
    sign_bundle(d, key)


def flip(rng: random.Random, data: bytes, bits: int) -> bytes:
    b = bytearray(data)
    for _ in range(bits):
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b) if bytes(b) != data else flip(rng, data, bits)


def meta_text(ctx: Context) -> str:
    return ctx.files[META].decode()


def signed_meta(ctx: Context, d: str, text: str | bytes) -> None:
    """model.yaml replaced and the bundle signed by the trusted key: only the parser and the model's
    checks stand between it and the daemon."""
    put(d, META, text.encode() if isinstance(text, str) else text)
    resign(d, ctx.key)


# ------------------------------------------------------------------ the classes

def onnx_truncated(rng, ctx, d):
    put(d, MODEL, ctx.files[MODEL][:rng.randrange(len(ctx.files[MODEL]))])
    return Made(DIFFERS.format(r"model\.onnx"))


def onnx_flipped(rng, ctx, d):
    put(d, MODEL, flip(rng, ctx.files[MODEL], rng.randint(1, 8)))
    return Made(DIFFERS.format(r"model\.onnx"))


def onnx_tiny(rng, ctx, d):
    put(d, MODEL, rng.randbytes(rng.randrange(17)))  # zero-length included
    return Made(DIFFERS.format(r"model\.onnx"))


def onnx_garbage(rng, ctx, d):
    put(d, MODEL, rng.randbytes(rng.randrange(1, 2 * MiB)))
    return Made(DIFFERS.format(r"model\.onnx"))


def onnx_other_model(rng, ctx, d):
    put(d, MODEL, ctx.other_onnx + rng.randbytes(rng.randrange(3)))
    return Made(DIFFERS.format(r"model\.onnx"))


def onnx_garbage_signed(rng, ctx, d):
    """Signed by the trusted key after the damage: the model check must refuse it. Cut within the first
    90 %: inside the graph, the field that holds nearly all of the file."""
    data = ctx.files[MODEL]
    kind = rng.randrange(3)
    put(d, MODEL, b"" if kind == 0 else rng.randbytes(rng.randrange(1, MiB)) if kind == 1 else
        data[:rng.randrange(int(len(data) * 0.9))])
    resign(d, ctx.key)
    return Made(r"^BUNDLE/model\.(onnx: not a readable ONNX model: |yaml: input\.name 'x' is not a graph input)")


def meta_after_signing(rng, ctx, d):
    data = ctx.files[META]
    kind = rng.randrange(3)
    put(d, META, data[:rng.randrange(len(data))] if kind == 0 else flip(rng, data, rng.randint(1, 4)) if kind == 1
        else data + rng.choice([b"\n", b"# a comment\n", b"extra: 1\n", rng.randbytes(rng.randrange(1, 64))]))
    return Made(DIFFERS.format(r"model\.yaml"))


_BREAKERS = ['key: "unterminated', "key: [1, 2", "key: {a: 1", "\tkey: 1", "key: @x", "key: `x", ": x",
             "key: 'a'b'", "---\nname: other", "key: *undefined", "- a list item in a mapping", "key: !!int 0xZZ",
             "key: 2001-13-45", "%TAG ! tag:x,2000:\n", "key: &a 1\nkey2: &a 2\n"]


def meta_invalid_yaml(rng, ctx, d):
    lines = meta_text(ctx).splitlines()
    kind = rng.randrange(4)
    if kind == 0:  # not UTF-8 text
        raw = bytearray(ctx.files[META])
        raw.insert(rng.randrange(len(raw)), rng.choice([0xff, 0xfe, 0xc0, 0x80]))
        signed_meta(ctx, d, bytes(raw))
        return Made(r"^BUNDLE/model\.yaml: not UTF-8 text$")
    if kind == 1:  # a control character YAML does not allow
        i = rng.randrange(1, len(lines))
        lines[i] += rng.choice(["\0", "\x01", "\x7f", "\x1b"])
        signed_meta(ctx, d, "\n".join(lines) + "\n")
        return Made(r"^BUNDLE/model\.yaml: invalid:\n  BUNDLE/model\.yaml: not valid YAML: unacceptable character")
    if kind == 2:  # a key given twice
        key = rng.choice([line.split(":")[0] for line in lines if line and not line.startswith(("#", " ", "-"))])
        lines.append(f"{key}: again")
        signed_meta(ctx, d, "\n".join(lines) + "\n")
        return Made(INVALID + r".*repeated key \(first given at line \d+\)")
    lines.insert(rng.randrange(1, len(lines) + 1), rng.choice(_BREAKERS))
    signed_meta(ctx, d, "\n".join(lines) + "\n")
    return Made(INVALID + "not valid YAML: ")


_WRONG = {  # key path -> values its schema refuses
    ("name",): [123, [], {}, None, 1.5, True, "", "-x", "a b"],
    ("version",): [[], {}, None, "x.y", "1..2", "", 1.5],
    ("input",): [3, "x", [], None],
    ("input", "name"): [1, [], {}, None],
    ("input", "width"): ["abc", -1, 0, 10 ** 9, [], None, 16385, "1e3"],
    ("input", "height"): ["abc", -1, 0, 10 ** 9, [], None, 16385, 2.5],
    ("input", "pixel_format"): ["rgb", 1, [], "bgr24 ", "BGR24"],
    ("input", "layout"): ["NCHW", "chw", 1, []],
    ("preprocess",): [3, "x", []],
    ("preprocess", "scale"): ["x", [], {}],
    ("preprocess", "mean"): ["x", [1, 2], {}, ["a"]],
    ("preprocess", "std"): [[0], [1, 0, 1], "x", [1, 1]],
    ("preprocess", "resize"): ["crop", 1],
    ("decoder",): [None, [], "classification", 1],
    ("decoder", "type"): [None, 1, [], "nonexistent"],
    ("decoder", "top_k"): ["x", [], {}],
    ("labels",): [5, "abc", {}, [[]], [1, [2]]],
}
_SCHEMA_OR_MODEL = r"^BUNDLE/model\.yaml: (invalid:\n  BUNDLE/model\.yaml:\d+: |decoder: |input\.name |input )"


def _set(meta: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        meta = meta[k]
    meta[path[-1]] = value


def meta_wrong_type(rng, ctx, d):
    meta = yaml.safe_load(meta_text(ctx))
    path = rng.choice(sorted(_WRONG))
    _set(meta, path, rng.choice(_WRONG[path]))
    signed_meta(ctx, d, yaml.safe_dump(meta, sort_keys=rng.random() < 0.5))
    return Made(_SCHEMA_OR_MODEL)


def meta_unknown_key(rng, ctx, d):
    meta = yaml.safe_load(meta_text(ctx))
    section = rng.choice([(), ("input",), ("preprocess",), ("decoder",)])
    name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(1, 20))) + "_x"
    _set(meta, (*section, name), rng.choice([1, "x", [], {}, None]))
    signed_meta(ctx, d, yaml.safe_dump(meta))
    return Made(r"^BUNDLE/model\.yaml: (invalid:\n  BUNDLE/model\.yaml:\d+: \S+: unknown key|decoder: decoder "
                r"classification: unknown parameters)")


def meta_missing_key(rng, ctx, d):
    meta = yaml.safe_load(meta_text(ctx))
    path = rng.choice([("name",), ("version",), ("input",), ("decoder",), ("input", "name"), ("input", "width"),
                       ("input", "height"), ("decoder", "type")])
    parent = meta
    for k in path[:-1]:
        parent = parent[k]
    del parent[path[-1]]
    signed_meta(ctx, d, yaml.safe_dump(meta))
    return Made(INVALID + r"\S+: Field required|^BUNDLE/model\.yaml: decoder: ")


def meta_huge_string(rng, ctx, d):
    """100 KiB .. 900 KiB strings where the schema or the model's checks bound them: a refusal must not
    echo them whole."""
    meta = yaml.safe_load(meta_text(ctx))
    huge = rng.choice("AZaz09") * rng.randrange(100 << 10, 900 << 10)
    path = rng.choice([("name",), ("version",), ("family",), ("input", "name"), ("input", "pixel_format"),
                       ("input", "layout"), ("decoder", "type"), ("decoder", "top_k"), ("preprocess", "resize"),
                       (huge,), ("input", huge), ("decoder", huge)])  # the last three: a huge unknown key
    _set(meta, path, huge if len(path[-1]) < 100 else 1)
    signed_meta(ctx, d, yaml.safe_dump(meta, width=1 << 30))
    return Made(_SCHEMA_OR_MODEL + r"|^BUNDLE/model\.yaml: decoder: decoder classification: unknown parameters")


def _laughs(levels: int, anchor: str) -> str:
    return "".join(f"{anchor}{i}: &{anchor}{i} [" + ", ".join([f"*{anchor}{i - 1}"] * 10 if i else ["lol"] * 10) +
                   "]\n" for i in range(levels))


def meta_yaml_bomb(rng, ctx, d):
    text = meta_text(ctx)
    kind = rng.randrange(5)
    if kind == 0:  # billion laughs as unknown keys (10^levels values)
        text = _laughs(rng.randint(6, 12), rng.choice("abc")) + text
        reason = "aliases expand to more than"
    elif kind == 1:  # billion laughs inside the decoder's parameters or the preprocessing
        where = rng.choice(["decoder", "preprocess"])
        bomb = "".join("  " + line + "\n" for line in _laughs(rng.randint(6, 12), "z").splitlines())
        text = text.replace(f"{where}:\n", f"{where}:\n" + bomb)
        reason = "aliases expand to more than"
    elif kind == 2:  # an alias inside its own anchor
        a = "r" * rng.randint(1, 8)
        text = text.replace("labels:\n", f"labels: &{a} [a, *{a}]\nold_labels:\n")
        reason = rf"alias \*{a} inside its own anchor \(a recursive structure\)"
    elif kind == 3:  # deep flow nesting, sequences or mappings
        n = rng.randint(65, 150_000)  # within model.yaml's 1 MiB
        text += "deep: " + ("[" * n + "]" * n if rng.random() < 0.5 else "{a: " * n + "1" + "}" * n) + "\n"
        reason = "nested more than 64 levels deep"
    else:  # deep block nesting
        n = rng.randint(65, 1000)  # indentation grows as n^2: within 1 MiB
        text += "deep:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(n)) + " " * (n + 1) + "x: 1\n"
        reason = "nested more than 64 levels deep"
    signed_meta(ctx, d, text)
    return Made(INVALID + "not valid YAML: " + reason)


def meta_mismatch(rng, ctx, d):
    """Valid YAML and schema, but not this model: the model's own checks refuse it."""
    meta = yaml.safe_load(meta_text(ctx))
    kind = rng.randrange(5)
    if kind == 0:
        meta["labels"] = [str(i) for i in range(rng.choice([1, 2, 3, 5, 8, 1000]))]
    elif kind == 1:
        meta["input"]["layout"] = "nhwc"
    elif kind == 2:
        meta["input"][rng.choice(["width", "height"])] = rng.choice([1, 64, 223, 225, 4096])
    elif kind == 3:
        meta["decoder"]["output"] = rng.randint(1, 99)
    else:
        meta["input"]["pixel_format"] = rng.choice(["gray8", "gray"])
    signed_meta(ctx, d, yaml.safe_dump(meta))
    return Made(r"^BUNDLE/model\.yaml: ")


def meta_not_a_mapping(rng, ctx, d):
    signed_meta(ctx, d, rng.choice(["", "\n", "# only a comment\n", "- a\n- b\n", "just a string\n", "42\n", "[]\n",
                                    "null\n", "~\n", "{}\n"]))
    return Made(r"^BUNDLE/model\.yaml: invalid:\n  BUNDLE/model\.yaml:(\d+|\?): ")


def sig_missing(rng, ctx, d):
    _unlink(os.path.join(d, SIG))
    if rng.random() < 0.5:
        put(d, MODEL, flip(rng, ctx.files[MODEL], 1))
    return Made(r"^BUNDLE/model\.sig: missing: the bundle is not signed$")


def sig_garbage(rng, ctx, d):
    kind = rng.randrange(4)
    data = (rng.randbytes(rng.randrange(0, 4096)) if kind == 0 else
            rng.choice([b"{}", b"[]", b"null", b"1", b'{"dsseEnvelope": 1}', b'{"dsseEnvelope": {"payload": "!!"}}',
                        b'{"dsseEnvelope": {"payload": "e30="}}', b'{"verificationMaterial": {}}', b"\xff\xfe"])
            if kind == 1 else
            ctx.files[SIG][:rng.randrange(len(ctx.files[SIG]))] if kind == 2 else
            flip(rng, ctx.files[SIG], rng.randint(1, 8)))
    put(d, SIG, data)
    return Made(r"^BUNDLE/model\.sig: (not a model-signing signature|not signed by a trusted key|signature does not "
                r"match|certificate )")


def sig_untrusted(rng, ctx, d):
    put(d, SIG, ctx.untrusted_sig)
    if rng.random() < 0.5:
        put(d, MODEL, flip(rng, ctx.files[MODEL], 1))
    return Made(r"^BUNDLE/model\.sig: not signed by a trusted key \(tried test\.pub in ")


def sig_other_files(rng, ctx, d):
    put(d, SIG, ctx.foreign_sig)
    return Made(DIFFERS.format(r"model\.(onnx|yaml)") + r"|^BUNDLE/\S+: signed, but missing from the bundle$")


def sig_manifest_edited(rng, ctx, d):
    """The signed statement rewritten (names, digests) without the key: the envelope no longer verifies."""
    import base64
    import json
    doc = json.loads(ctx.files[SIG])
    statement = base64.b64decode(doc["dsseEnvelope"]["payload"])
    old = rng.choice([b'"model.yaml"', b'"model.onnx"', b'"sha256"'])
    new = rng.choice([b'"../model.yaml"', b'"/etc/passwd"', b'"model.onnx "', b'"sha512"', b'"labels.txt"'])
    doc["dsseEnvelope"]["payload"] = base64.b64encode(statement.replace(old, new, 1)).decode()
    put(d, SIG, json.dumps(doc).encode())
    return Made(r"^BUNDLE/model\.sig: (not a model-signing signature|not signed by a trusted key|signature does not "
                r"match)")


_EXTRA = ["labels.txt", "model.onnx.bak", "Model.onnx", "model.yaml~", ".model.sig.swp", ".hidden", ".gitignore",
          ".git", "...", " ", "été.txt", "x" * 255, "model.sig.old", "README", "weights.bin", "-rf", "*"]


def extra_file(rng, ctx, d):
    name = rng.choice(_EXTRA)
    if rng.random() < 0.3:
        name = f"{name}{rng.randrange(1000)}"[:255]
    put(d, name, rng.randbytes(rng.randrange(0, 4096)))
    return Made(r"^BUNDLE/" + __import__("re").escape(name) +
                r": not covered by the signature \(a file was added to the signed bundle\)$")


def symlink(rng, ctx, d):
    name = rng.choice([MODEL, MODEL, META, SIG, "labels.txt"])
    target = rng.choice(["/etc/passwd", ctx.huge_outside, "/dev/zero", "/dev/urandom", "/nonexistent/dangling",
                         "dangling-relative", ctx.outside, "/", ".", os.path.join(ctx.good, name)])
    _unlink(os.path.join(d, name))
    os.symlink(target, os.path.join(d, name))
    return Made(SYMLINK.format(name.replace(".", r"\.")))


def subdirectory(rng, ctx, d):
    name = rng.choice([MODEL, META, SIG, "sub", ".git", "labels"])
    _unlink(os.path.join(d, name))
    os.mkdir(os.path.join(d, name))
    if rng.random() < 0.5:
        with open(os.path.join(d, name, "inner.bin"), "wb") as f:
            f.write(b"x")
    return Made(NOT_REGULAR.format(name.replace(".", r"\.")))


def fifo(rng, ctx, d):
    name = rng.choice([MODEL, META, SIG, "labels.txt"])
    _unlink(os.path.join(d, name))
    os.mkfifo(os.path.join(d, name))  # no writer: a blocking open or read would wait forever
    return Made(NOT_REGULAR.format(name.replace(".", r"\.")))


def device(rng, ctx, d):
    name = rng.choice([MODEL, META, SIG, "labels.txt"])
    major_minor = rng.choice([(1, 5), (1, 3), (1, 9), (1, 8)])  # /dev/zero, null, urandom, random
    _unlink(os.path.join(d, name))
    os.mknod(os.path.join(d, name), 0o644 | stat.S_IFCHR, os.makedev(*major_minor))
    return Made(NOT_REGULAR.format(name.replace(".", r"\.")))


def unix_socket(rng, ctx, d):
    name = rng.choice([MODEL, "sock"])
    _unlink(os.path.join(d, name))
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(os.path.join(d, name))
    finally:
        s.close()  # the socket file stays
    return Made(r"^BUNDLE/" + name.replace(".", r"\.") + r": No such device or address; a bundle holds only regular "
                r"files$")


def too_many(rng, ctx, d):
    n = rng.choice([254, 300, 1000, 2000])  # with the 3 files: 257 and more
    for i in range(n):
        open(os.path.join(d, f"f{i:05}"), "wb").close()
    return Made(rf"^BUNDLE: {n + 3} entries; a bundle holds at most 256 files$")


def oversized(rng, ctx, d):
    """Sparse files past a limit, and 1 GiB models that the signature alone refuses; none may be read."""
    kind = rng.randrange(9)
    if kind <= 2:
        size = [GiB + 1, 2 * GiB, 64 * GiB][kind] if rng.random() < 0.5 else rng.randrange(GiB + 1, 1 << 40)
        sparse(d, MODEL, size)
        return Made(OVER.format(r"model\.onnx") + r"model\.onnx \(model\.max_model_mib\)$", oversized=size)
    if kind <= 5:
        name = [META, SIG, "labels.txt"][kind - 3]
        limit = MiB if name != "labels.txt" else 16 * MiB
        size = rng.choice([limit + 1, 100 * MiB, rng.randrange(100 * MiB, 4 * GiB)])
        sparse(d, name, size)
        return Made(OVER.format(name.replace(".", r"\.")), oversized=size)
    if kind == 6:  # at the limit each, too much together
        sparse(d, MODEL, GiB)
        for i in range(5):
            sparse(d, f"part{i}.bin", 16 * MiB)
        return Made(r"^BUNDLE: more than 1140850688 bytes in all, the limit for a whole bundle "
                    r"\(model\.max_bundle_mib\)$", oversized=GiB)
    sparse(d, MODEL, GiB)  # within its limit: the signature must refuse it before it is read
    if kind == 7:
        _unlink(os.path.join(d, SIG))
        return Made(r"^BUNDLE/model\.sig: missing: the bundle is not signed$", oversized=GiB)
    put(d, SIG, ctx.untrusted_sig if rng.random() < 0.5 else rng.randbytes(512))
    return Made(r"^BUNDLE/model\.sig: (not signed by a trusted key|not a model-signing signature)", oversized=GiB)


def changed_while_read(rng, ctx, d):
    put(d, MODEL, ctx.files[MODEL])  # its own copy: the change must not reach the good bundle
    return Made(CHANGED, stage=rng.choice(["grow", "grow-64g", "shrink"]))


def growing_while_read(rng, ctx, d):
    put(d, MODEL, ctx.files[MODEL] + b"\0" * 4096)  # the writer's first append, before the checks start
    return Made(DIFFERS.format(r"model\.onnx") + "|" + CHANGED, writer=True)


# (class, count, make): 1,000 in all. Device nodes need root; without it they count as skipped.
CLASSES: list[tuple[str, int, Callable]] = [
    ("model.onnx truncated after signing", 100, onnx_truncated),
    ("model.onnx bit-flipped after signing", 100, onnx_flipped),
    ("model.onnx 0-16 bytes after signing", 10, onnx_tiny),
    ("model.onnx random garbage after signing", 49, onnx_garbage),
    ("model.onnx replaced by another model", 10, onnx_other_model),
    ("model.onnx empty/garbage/truncated, then validly signed", 40, onnx_garbage_signed),
    ("model.yaml changed after signing", 100, meta_after_signing),
    ("model.yaml not YAML / not UTF-8 / repeated key (validly signed)", 30, meta_invalid_yaml),
    ("model.yaml wrong types and values (validly signed)", 80, meta_wrong_type),
    ("model.yaml unknown keys (validly signed)", 35, meta_unknown_key),
    ("model.yaml required key missing (validly signed)", 15, meta_missing_key),
    ("model.yaml 100-900 KiB strings (validly signed)", 25, meta_huge_string),
    ("model.yaml bombs: billion laughs, recursive alias, 65-150,000 levels deep (validly signed)", 30,
     meta_yaml_bomb),
    ("model.yaml does not fit the graph (validly signed)", 25, meta_mismatch),
    ("model.yaml empty or not a mapping (validly signed)", 10, meta_not_a_mapping),
    ("model.sig missing", 3, sig_missing),
    ("model.sig garbage / truncated / bit-flipped", 120, sig_garbage),
    ("model.sig by an untrusted key", 15, sig_untrusted),
    ("model.sig over another bundle (trusted key)", 10, sig_other_files),
    ("model.sig manifest rewritten", 15, sig_manifest_edited),
    ("an extra file", 50, extra_file),
    ("symlinks (/etc/passwd, 2 GiB file, /dev/zero, dangling, directories)", 40, symlink),
    ("subdirectories", 10, subdirectory),
    ("FIFOs (no writer)", 8, fifo),
    ("device nodes (/dev/zero, null, urandom, random)", 6, device),
    ("unix sockets", 3, unix_socket),
    ("257-2,003 entries", 4, too_many),
    ("sparse oversized files (model.onnx 1 GiB+1..1 TiB, model.yaml/model.sig/labels 1 MiB+1..4 GiB, "
     "bundle total) and unsigned/untrusted 1 GiB models", 40, oversized),
    ("model.onnx changes after the size check (grows 1 B / 64 GiB, shrinks)", 12, changed_while_read),
    ("model.onnx appended to while being checked (a concurrent writer)", 5, growing_while_read),
]
assert sum(n for _, n, _ in CLASSES) == 1000


def cases(total: int = 1000):
    """(class, index in class, make) for `total` cases, in the proportions of CLASSES."""
    for cls, n, make in CLASSES:
        for i in range(max(1, round(n * total / 1000))):
            yield cls, i, make


def rng_for(seed: int, cls: str, i: int) -> random.Random:
    return random.Random(f"{seed}:{cls}:{i}")  # str seeds hash with sha512: the same in every run
