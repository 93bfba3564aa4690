"""What the .deb ships for its reader: man pages that say what 0.2 is and name every command and option of
the real CLI, the docs and examples that README and the operator's guide promise, the units' Documentation=
that resolve to installed files, a package description of memfd rings (not 0.1's POSIX shared memory), and
docs/operations/cameras.md's quote of `camera add` word for word.

The package is the real one `make test` builds before pytest (conftest.built_deb; EDGEINFER_DEB_DIR for
another build): its files are read from `dpkg-deb --fsys-tarfile`, nothing is installed."""
from __future__ import annotations

import gzip
import os
import posixpath
import re
import subprocess
import sys
import tarfile

import pytest

from conftest import ROOT, built_deb, require_tool
from edgeinfer import __version__

DOC = "usr/share/doc/edgeinfer"


@pytest.fixture(scope="module")
def deb() -> str:
    require_tool("dpkg-deb")
    return built_deb()


@pytest.fixture(scope="module")
def shipped(deb) -> dict[str, bytes | None]:
    """Every path of the package outside the virtualenv: its bytes (None: a directory or a link)."""
    files: dict[str, bytes | None] = {}
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE) as p:
        try:
            with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
                for m in tar:
                    name = os.path.normpath(m.name).lstrip("./")
                    if name.startswith("opt/"):
                        continue
                    files[name] = tar.extractfile(m).read() if m.isfile() else None
        finally:
            p.stdout.close()
            assert p.wait(timeout=300) == 0, f"dpkg-deb --fsys-tarfile {deb} failed"
    return files


def text(shipped: dict, path: str) -> str:
    data = shipped[path]
    return (gzip.decompress(data) if path.endswith(".gz") else data).decode()


def roff_text(roff: str) -> str:
    """A man page's words as a reader sees them: no font escapes, `\\-` a hyphen."""
    return re.sub(r"\\f[BIRP]", "", roff).replace("\\-", "-").replace("\\&", "")


def test_man_pages_describe_this_release(shipped):
    pages = [p for p in shipped if p.startswith("usr/share/man/") and p.endswith(".gz")]
    assert sorted(pages) == ["usr/share/man/man1/edgeinferctl.1.gz", "usr/share/man/man8/edgeinferd.8.gz"]
    for page in pages:
        words = roff_text(text(shipped, page))
        assert "/dev/shm" not in words and "0.1.0" not in words, f"{page} still describes 0.1"
        assert f'"edgeinfer {__version__}"' in words.splitlines()[0], f"{page}: {words.splitlines()[0]}"
        assert "/run/edgeinfer/ingress.sock" in words, f"{page} does not name the cameras' socket"
    daemon = roff_text(text(shipped, "usr/share/man/man8/edgeinferd.8.gz"))
    for what in ("memfd", "results.sock", "lanes", "fd store", "model.sig", "SIGHUP", "EXIT STATUS", "FILES"):
        assert what in daemon, f"edgeinferd(8) says nothing of {what}"


def test_docs_and_examples_are_shipped_and_their_links_resolve(shipped):
    topics = sorted(f"operations/{p.name}" for p in (ROOT / "docs/operations").glob("*.md"))
    assert topics, "docs/operations/ has no topic"
    for name in ("README.md", "abi.md", "operations.md", *topics, "decoders.md", "reliability.md", "architecture.md",
                 "performance.md"):
        assert f"{DOC}/{name}" in shipped, f"{name} is not shipped (plain, as the units and the docs name it)"
    examples = subprocess.run(["git", "-C", str(ROOT), "ls-files", "examples"], capture_output=True, text=True,
                              check=True, timeout=30).stdout.split()
    assert {"examples/producer.c", "examples/reader.c"} <= set(examples)
    for e in examples:
        assert f"{DOC}/{e}" in shipped, f"{e} is not shipped (README and the operator's guide promise it)"
    # The docs link each other by relative path: in /usr/share/doc/edgeinfer each such link, taken from the
    # linking file's folder (decisions/ links ../architecture.md), lands on a shipped file.
    for md in [p for p in shipped if p.startswith(DOC) and p.endswith(".md")]:
        for target in re.findall(r"\]\(([^)#\s]+)", text(shipped, md)):
            if "://" in target or target.startswith(("/", "mailto:")):
                continue  # a URL
            if md == f"{DOC}/README.md":
                continue  # README's links are the source tree's (docs/abi.md)
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(md), target))
            if not resolved.startswith(DOC + "/"):
                continue  # the source tree's layout (abi.md's ../native/..., the records' ../../CHANGELOG.md)
            assert resolved in shipped, f"{md} links to {target}, which the package does not ship"


def test_units_documentation_resolves_to_shipped_files(shipped):
    units = [p for p in shipped if p.startswith("lib/systemd/system/") and shipped[p] is not None]
    assert sorted(units) == [f"lib/systemd/system/{u}" for u in ("edgeinfer-camera@.service", "edgeinfer-gateway.service",
                                                                 "edgeinfer-mqtt.service", "edgeinferd.service",
                                                                 "edgeinferd.socket")], units
    seen = 0
    for unit in units:
        for line in text(shipped, unit).splitlines():
            if not line.startswith("Documentation="):
                continue
            for uri in line.split("=", 1)[1].split():
                seen += 1
                if uri.startswith("file://"):
                    path = uri[len("file://"):].strip("/")
                    assert path in shipped, f"{unit}: Documentation={uri} is not in the package"
                else:
                    m = re.fullmatch(r"man:([\w@.-]+)\((\d)\)", uri)
                    assert m, f"{unit}: Documentation={uri}: neither file:// nor man:"
                    page = f"usr/share/man/man{m[2]}/{m[1]}.{m[2]}.gz"
                    assert page in shipped, f"{unit}: Documentation={uri}: no {page}"
    assert seen >= 10


def test_package_description_and_sysusers_say_memfd(deb, shipped):
    description = subprocess.run(["dpkg-deb", "-f", deb, "Description"], capture_output=True, text=True,
                                 check=True, timeout=60).stdout
    assert "POSIX shared memory" not in description and "memfd" in description, description
    sysusers = text(shipped, "usr/lib/sysusers.d/edgeinfer.conf")
    assert "shared-memory" not in sysusers and "ingress.sock" in sysusers, sysusers


def _field(deb: str, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", deb, name], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def _paths(deb: str) -> list[str]:
    out = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True, timeout=300).stdout
    import io
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        return [os.path.normpath(m.name).lstrip("./") for m in tar]


def test_the_daemon_installs_300_mb_or_less_and_pyav_is_a_package_of_its_own(deb):
    """Issue 37, item 4 (decision record 0036): edgeinfer without PyAV and the FFmpeg libraries of its wheel, at most
    300 MB installed; edgeinfer-rtsp holds exactly those files, in the same virtualenv, and upgrades with it."""
    rtsp = built_deb("edgeinfer-rtsp")
    assert int(_field(deb, "Installed-Size")) * 1024 <= 300_000_000, _field(deb, "Installed-Size")
    assert "edgeinfer-rtsp" in _field(deb, "Recommends").split(", ")
    assert _field(rtsp, "Depends").split(", ")[-1] == f"edgeinfer (= {__version__})"
    assert _field(rtsp, "Breaks") == _field(rtsp, "Replaces") == "edgeinfer (<< 0.3.0~)"
    site = "opt/venvs/edgeinfer/lib/python3.11/site-packages/"
    ours = [p for p in _paths(deb) if p.startswith(site)]
    assert f"{site}edgeinfer/__init__.py" in ours and f"{site}onnxruntime/__init__.py" in ours
    top = {p[len(site):].split("/")[0] for p in ours if p != site.rstrip("/")}
    assert "edgeinfer" in top and not [t for t in top if t == "av" or t.startswith(("av.", "av-"))], sorted(top)
    theirs = [p for p in _paths(rtsp) if p.startswith(("opt/", "usr/bin", "usr/lib", "etc/"))]
    assert f"{site}av/__init__.py" in theirs and any(p.startswith(f"{site}av.libs/") for p in theirs)
    assert {p[len(site):].split("/")[0] for p in theirs if p.startswith(site)} == \
        {"av", "av.libs", "av-18.1.0.dist-info"}, theirs
    assert not [p for p in theirs if p.startswith(("usr/bin", "usr/lib", "etc/"))]


def test_the_openvino_provider_is_a_package_of_its_own_that_edgeinfer_suggests(deb):
    """Issue 38, item 6 (decision record 0038): ONNX Runtime's OpenVINO plugin EP (165 MB) is not in edgeinfer, which
    suggests it; edgeinfer-openvino holds exactly its files, in the same virtualenv, and upgrades with it."""
    ov = built_deb("edgeinfer-openvino")
    assert "edgeinfer-openvino" in _field(deb, "Suggests").split(", ")
    assert _field(ov, "Depends").split(", ")[-1] == f"edgeinfer (= {__version__})"
    site = "opt/venvs/edgeinfer/lib/python3.11/site-packages/"
    assert not [p for p in _paths(deb) if p.startswith(f"{site}onnxruntime_ep_openvino")]
    theirs = [p for p in _paths(ov) if p.startswith(("opt/", "usr/bin", "usr/lib", "etc/"))]
    assert f"{site}onnxruntime_ep_openvino/__init__.py" in theirs
    assert any(p.endswith("libonnxruntime_providers_openvino_plugin.so") for p in theirs)
    assert {p[len(site):].split("/")[0] for p in theirs if p.startswith(site)} == \
        {"onnxruntime_ep_openvino", "onnxruntime_ep_openvino-1.8.1.dist-info"}, sorted(theirs)[:20]
    assert not [p for p in theirs if p.startswith(("usr/bin", "usr/lib", "etc/"))]


def _maintainer_script(deb: str, name: str, check: bool = True) -> str:
    return subprocess.run(["dpkg-deb", "-I", deb, name], capture_output=True, text=True, check=check,
                          timeout=60).stdout


def _shipped_disabled(deb: str, shipped: dict, unit: str, user: str, conffile: str) -> str:
    """What every unit the package ships disabled holds to (the gateway's, the bridge's): its configuration a
    conffile, its user from sysusers.d (no home, no shell); the maintainer scripts never enable or start it, an
    upgrade only try-restarts it, a remove stops and disables it, a purge removes its user. Returns the prerm."""
    assert shipped[f"lib/systemd/system/{unit}.service"] is not None
    assert conffile.lstrip("/") in shipped
    conffiles = _maintainer_script(deb, "conffiles").split()
    assert {conffile, "/etc/edgeinfer/edgeinferd.yaml"} <= set(conffiles), conffiles
    sysusers = text(shipped, "usr/lib/sysusers.d/edgeinfer.conf")
    assert re.search(rf"^u {user} - \"[^\"]+\" / /usr/sbin/nologin$", sysusers, re.M), sysusers
    postinst = _maintainer_script(deb, "postinst")
    assert unit not in _maintainer_script(deb, "preinst", check=False), \
        f"an upgrade stops {unit} (and nothing starts it again)"
    said = [line.strip() for line in postinst.splitlines() if unit in line]
    assert said, postinst
    for line in said:  # enabled only where the operator had enabled it; never started, only try-restarted
        assert not re.search(r"deb-systemd-invoke (start|restart) ", line), line
        assert not line.startswith("deb-systemd-helper enable") or "was-enabled" in postinst, line
    assert any("try-restart" in line for line in said), said
    prerm = _maintainer_script(deb, "prerm")
    assert f"stop {unit}.service" in prerm and f"-name {unit}.service -type l -delete" in prerm
    assert f"userdel {user}" in _maintainer_script(deb, "postrm")
    return prerm


def test_gateway_is_shipped_disabled_with_its_user_and_conffile(deb, shipped):
    """edgeinfer-gateway, shipped disabled (_shipped_disabled), user edgeinfer-gw."""
    _shipped_disabled(deb, shipped, "edgeinfer-gateway", "edgeinfer-gw", "/etc/edgeinfer/gateway.yaml")


def test_mqtt_bridge_is_shipped_disabled_with_its_user_and_conffile(deb, shipped):
    """edgeinfer-mqtt, shipped disabled as the gateway: its unit (the decision log in its StateDirectory=),
    stopped on remove before the daemon, its decision log removed on purge."""
    unit = text(shipped, "lib/systemd/system/edgeinfer-mqtt.service")
    for line in ("Type=notify", "ExecStart=/usr/bin/edgeinferctl mqtt --config /etc/edgeinfer/mqtt.yaml",
                 "RestartPreventExitStatus=2", "User=edgeinfer-mqtt", "SupplementaryGroups=edgeinfer",
                 "StateDirectory=edgeinfer-mqtt", "MemoryDenyWriteExecute=yes"):
        assert f"\n{line}\n" in unit, line
    assert "[Install]\nWantedBy=multi-user.target\n" in unit
    prerm = _shipped_disabled(deb, shipped, "edgeinfer-mqtt", "edgeinfer-mqtt", "/etc/edgeinfer/mqtt.yaml")
    # Stopped before the daemon's own snippet stops edgeinferd (it would reconnect, and the socket start it again).
    assert prerm.index("stop edgeinfer-mqtt.service") < prerm.index("deb-systemd-invoke stop 'edgeinferd.service'"), prerm
    assert "rm -rf /var/lib/edgeinfer-mqtt" in _maintainer_script(deb, "postrm")


# ------------------------------------------------------------------ the man pages against the real CLI


def _help(argv: list[str]) -> str:
    r = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _options(helptext: str) -> set[str]:
    """The long options of an argparse --help (its option lines are indented by exactly two spaces)."""
    return {o for line in re.findall(r"^  (-\S.*)$", helptext, re.M)
            for o in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line.split("  ")[0])} - {"--help"}


def _commands(argv: list[str], prefix: list[str]):
    """(command words, their long options) for every leaf command of the CLI, from its --help."""
    helptext = _help(argv + prefix)
    subs = re.search(r"^positional arguments:\n  \{([\w,-]+)\}", helptext, re.M)
    if not subs:
        yield prefix, _options(helptext)
        return
    for sub in subs[1].split(","):
        yield from _commands(argv, prefix + [sub])


def _mentioned(word: str, page: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", page) is not None


def _entries(roff: str) -> list[tuple[str, str]]:
    """A man page's tagged paragraphs (.TP): (the tag line, the tag and its text), as a reader sees them."""
    entries = []
    for chunk in re.split(r"^\.TP\n", roff, flags=re.M)[1:]:
        chunk = re.split(r"^\.S[HS] ", chunk, flags=re.M)[0]
        tag = chunk.split("\n", 1)[0]
        entries.append((roff_text(tag), roff_text(chunk)))
    return entries


def test_edgeinferctl_man_page_names_every_command_and_option():
    """Each command of the real `edgeinferctl` has its paragraph in edgeinferctl(1), naming every option."""
    entries = _entries((ROOT / "packaging/man/edgeinferctl.1").read_text())
    commands = list(_commands(["-m", "edgeinfer.cli"], []))
    assert len(commands) >= 17 and ["model", "self-sign"] in [c for c, _ in commands]
    missing = []
    for words, options in commands:
        command = " ".join(words)
        about = " ".join(body for tag, body in entries if _mentioned(command, tag))
        if not about:
            missing.append(f"{command}: no paragraph")
        missing += [f"{command}: {o}" for o in sorted(options) if not _mentioned(o, about)]
    assert missing == [], f"edgeinferctl(1) lacks {missing}"


def test_edgeinferd_man_page_names_every_option():
    page = roff_text((ROOT / "packaging/man/edgeinferd.8").read_text())
    options = _options(_help(["-c", "import sys; from edgeinfer.cli import edgeinferd_main as m; sys.exit(m())"]))
    assert "--verify-only" in options
    assert [o for o in sorted(options) if not _mentioned(o, page)] == []


def test_operations_md_quotes_camera_add_word_for_word(tmp_path):
    """docs/operations/cameras.md quotes what `camera add` prints; the real command prints exactly that (its camera
    directory a temporary one here, --no-user: no system user made; neither changes a word of the output)."""
    doc = (ROOT / "docs/operations/cameras.md").read_text()
    quoted = re.search(r"^`camera add` prints, word for word:\n\n```text\n(.*?)^```$", doc, re.M | re.S)
    assert quoted, "docs/operations/cameras.md no longer quotes camera add's output"
    command = re.search(r"^edgeinferctl (camera add gate1 .*)$", doc, re.M)[1].split()
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli", *command, "--no-user", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.replace(str(tmp_path), "/etc/edgeinfer/cameras") == quoted[1]
