"""Configuration: validation errors name the key and the YAML line; the CLI check; a 0.1 file still
starts (with warnings). The shipped file against the schema: test_shipped_config.py."""
from __future__ import annotations

import grp
import os
import re
import subprocess
import uuid

import pytest

from daemon_helpers import edgeinferd_args
from edgeinfer.cli import ctl as cli
from edgeinfer.config import schema as config
from edgeinfer.abi import ring
from edgeinfer.config.schema import ConfigError, load_config

GOOD = """\
model:
  bundle: /tmp/bundle
streams:
  - name: cam0
    producer: {user: 0}
    max_age_ms: 100
runtime:
  scheduling: fifo
"""


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def check_config(path: str) -> subprocess.CompletedProcess:
    """`edgeinferd --check-config --config PATH`, as an operator runs it."""
    return subprocess.run(edgeinferd_args(path, "--check-config"), capture_output=True, text=True, timeout=60)


def refused(tmp_path, text: str, where: str) -> str:
    """The file is refused by load_config and by --check-config (exit 2), both naming `where`
    (':LINE: key'); returns load_config's message."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}{where}" in str(info.value), str(info.value)
    r = check_config(path)
    assert r.returncode == 2 and f"{path}{where}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    return str(info.value)


def test_good_config_loads_with_defaults(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    s = cfg.streams[0]
    assert (s.name, s.max_age_ms, s.segment) == ("cam0", 100, None)
    assert cfg.warnings == []  # names its producer, uses no ABI 1 key
    assert cfg.producer_of(s).resolve().uids == {0}
    assert s.readers.groups == ["edgeinfer"] and s.readers.users == []
    assert (cfg.ingress.socket, cfg.ingress.results_socket) == (ring.INGRESS_SOCKET, ring.RESULTS_SOCKET)
    assert cfg.runtime.duty_ceiling == 0.9 and cfg.metrics.listen == "127.0.0.1:9464"
    rt = cfg.runtime
    assert (rt.max_sessions, rt.geometry_changes, rt.geometry_window_s, rt.geometry_cooldown_s) == (8, 4, 60, 60)
    assert cfg.shm.result_records == 64


@pytest.mark.parametrize("text, expect", [
    (GOOD.replace("    max_age_ms: 100", "    max_age_ms: 100\n    colour: red"), ":7: streams[0].colour: unknown key"),
    (GOOD.replace("max_age_ms: 100", "max_age_ms: -1"), ":6: streams[0].max_age_ms: Input should be greater than 0"),
    (GOOD.replace("scheduling: fifo", "scheduling: fast"), ":8: runtime.scheduling: Input should be 'fifo'"),
    (GOOD.replace("  bundle: /tmp/bundle", "  warmup_runs: 3"), ":1: models: no model configured"),
    (GOOD.replace("name: cam0", "name: 'bad name!'"), ":4: streams[0].name: Value error"),
    (GOOD + "  loop_cpus: [99]\n", ":9: runtime.loop_cpus: Value error, CPUs [99] are not available"),
    (GOOD + "ingress:\n  max_pending: 0\n", ":10: ingress.max_pending: Input should be greater than or equal to 1"),
    (GOOD.replace("streams:", "streams: [").replace("runtime:", "runtime:"), "not valid YAML"),
])
def test_each_error_names_the_key_and_line(tmp_path, text, expect):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert expect in str(info.value), str(info.value)


def test_every_problem_is_reported_at_once(tmp_path):
    text = GOOD.replace("max_age_ms: 100", "max_age_ms: 0\n    priority: 500")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert len(info.value.problems) == 2


@pytest.mark.parametrize("name", [
    '"cam0\\n"',        # a trailing newline (quoted)
    "|\n      cam0",    # a trailing newline (a block scalar: what a template easily produces)
    "../cam0",
    "cam/0",
    "/dev/shm/cam0",
    ".cam0",
    '"cam0\\0x"',
    "c" * (ring.STREAM_NAME_MAX + 1),
])
def test_stream_names_that_are_not_plain_names_are_refused_with_key_and_line(tmp_path, name):
    """A stream name goes into log lines, metric labels and the handshake: ring.h's rule, checked here
    so that no name the daemon serves could be refused by every client (or split a log line)."""
    msg = refused(tmp_path, GOOD.replace("name: cam0", f"name: {name}"), ":4: streams[0].name: Value error")
    assert "no path characters, no newline" in msg


def test_longest_stream_name_is_accepted(tmp_path):
    name = "c" * ring.STREAM_NAME_MAX
    assert load_config(write(tmp_path, GOOD.replace("name: cam0", f"name: {name}"))).streams[0].name == name


def test_a_segment_that_is_a_path_is_refused_although_ignored(tmp_path):
    """streams[].segment (ABI 1) is ignored, but a path in it is still an error, not silently accepted."""
    msg = refused(tmp_path, GOOD.replace("    max_age_ms", "    segment: ../../x\n    max_age_ms"),
                  ":6: streams[0].segment: Value error")
    assert "a segment is a plain name" in msg


@pytest.mark.parametrize("key, value, line", [
    ("socket", "run/edgeinfer/ingress.sock", 10),                 # relative
    ("results_socket", "results.sock", 10),
    ("socket", "/" + "s" * 107, 10),                               # 108 bytes: sun_path holds 107 and a NUL
    ("results_socket", "/run/" + "é" * 52, 10),                    # 57 characters, 109 bytes
])
def test_socket_paths_relative_or_too_long_are_refused(tmp_path, key, value, line):
    msg = refused(tmp_path, GOOD + f"ingress:\n  {key}: {value}\n", f":{line}: ingress.{key}: Value error")
    assert "an absolute path of at most 107 bytes" in msg


def test_socket_path_of_107_bytes_is_accepted(tmp_path):
    path = "/" + "s" * 106
    cfg = load_config(write(tmp_path, GOOD + f"ingress:\n  socket: {path}\n"))
    assert cfg.ingress.socket == path and len(path.encode()) == config.SUN_PATH_MAX == 107


@pytest.mark.parametrize("key, value, expect", [
    ("producer", "{user: %s}", "no such user: '%s'"),
    ("producer", "{group: %s}", "no such group: '%s'"),
    ("readers", "{users: [%s]}", "no such user: '%s'"),
    ("readers", "{groups: [root, %s]}", "no such group: '%s'"),
])
def test_unknown_users_and_groups_are_refused_with_their_line(tmp_path, key, value, expect):
    """Names are resolved when the file is loaded: a typo is an error with its line, not a stream that
    refuses its own camera at run time."""
    nobody = f"eit-nobody-{uuid.uuid4().hex[:6]}"
    text = GOOD.replace("    producer: {user: 0}\n", f"    {key}: {value % nobody}\n")
    msg = refused(tmp_path, text, f":5: streams[0].{key}: Value error")
    assert expect % nobody in msg


def test_a_group_producer_without_trust_any_member_is_refused_with_its_line(tmp_path):
    """The issue: `producer: {group: edgeinfer}` let any group member take the stream before its camera, and
    nothing was said at start. A producer without a user is a configuration error (with its line) unless the
    stream says it trusts every member; trust_any_member next to a user means nothing, so it is an error too."""
    group = grp.getgrgid(os.getgid()).gr_name
    msg = refused(tmp_path, GOOD.replace("{user: 0}", f"{{group: {group}}}"), ":5: streams[0].producer: Value error")
    assert f"lets any member of group {group} take the stream" in msg
    assert f"producer: {{group: {group}, trust_any_member: true}}" in msg  # what to write, if meant
    msg = refused(tmp_path, GOOD.replace("{user: 0}", f"{{group: {group}, trust_any_member: false}}"),
                  ":5: streams[0].producer: Value error")
    assert "trust_any_member: true" in msg
    msg = refused(tmp_path, GOOD.replace("{user: 0}", f"{{user: 0, group: {group}, trust_any_member: true}}"),
                  ":5: streams[0].producer: Value error")
    assert "trust_any_member is for a producer that names only a group" in msg


def test_trusting_any_member_of_a_group_is_warned_at_every_start(tmp_path, children, bundles):
    """With `trust_any_member: true` the file loads, and the real daemon warns at every start (its line
    named), as --check-config does; any member of the group is then the stream's producer."""
    from daemon_helpers import daemon_log, start_daemon, stop_daemon, write_config
    group = grp.getgrgid(os.getgid()).gr_name
    cfg = write_config(tmp_path, bundles("orientation"),
                       [{"name": "trusted", "producer": f"{{group: {group}, trust_any_member: true}}"}])
    line = next(i for i, text in enumerate(open(cfg), 1) if "trust_any_member" in text)
    warning = (f"{cfg}:{line}: streams[0].producer: stream trusted: any member of group {group} may produce it "
               f"(trust_any_member)")
    r = check_config(cfg)
    assert r.returncode == 0 and f"edgeinferd: warning: {warning}" in r.stderr, r.stderr
    assert r.stdout.strip() == f"{cfg}: OK (1 warnings)"
    assert load_config(cfg).producer_of(load_config(cfg).streams[0]).resolve().gids == {os.getgid()}
    for start in range(2):
        log = tmp_path / f"daemon-{start}.log"
        proc = start_daemon(children, cfg, log_file=str(log))
        stop_daemon(proc)
        assert daemon_log(proc).count(warning) == 1, f"start {start + 1}: {daemon_log(proc)[-2000:]}"


CONFIG_0_1 = """\
model:
  bundle: /var/lib/edgeinfer/models/current
  warmup_runs: 3
streams:
  - name: cam0
    segment: edgeinfer.cam0
    max_age_ms: 200
  - name: cam1
    producer: {user: 0}
shm:
  dir: /dev/shm
  allowed_uids: [1001, 1002]
  result_records: 64
  result_group: video
metrics:
  listen: 127.0.0.1:9464
"""


def test_a_0_1_config_starts_with_one_warning_per_deprecated_key(tmp_path):
    """An upgraded host keeps its 0.1 file: it loads, each ABI 1 key gives one warning with its line,
    and the stream that names no producer gets the producers shm.allowed_uids named."""
    path = write(tmp_path, CONFIG_0_1)
    cfg = load_config(path)
    expected = {(5, "streams[0].name"), (6, "streams[0].segment"), (11, "shm.dir"), (12, "shm.allowed_uids"),
                (14, "shm.result_group")}
    got = [re.match(rf"{re.escape(path)}:(\d+): (\S+): ", w) for w in cfg.warnings]
    assert all(got), cfg.warnings
    assert sorted((int(m[1]), m[2]) for m in got) == sorted(expected)  # exactly one each, nothing else
    assert "names no producer: one of shm.allowed_uids [1001, 1002] may produce it" in cfg.warnings[0]
    assert cfg.producer_of(cfg.streams[0]).resolve().uids == {1001, 1002}
    assert cfg.producer_of(cfg.streams[1]).resolve().uids == {0}  # named: no legacy trust

    r = check_config(path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{path}: OK (5 warnings)"
    lines = r.stderr.splitlines()
    assert lines == [f"edgeinferd: warning: {w}" for w in cfg.warnings], r.stderr


# /etc/edgeinfer/edgeinferd.yaml as 0.1 shipped it: an upgraded host that never edited it must start.
SHIPPED_0_1 = """\
# /etc/edgeinfer/edgeinferd.yaml — edgeinferd configuration.
# Every key is shown with its default. Unknown keys are errors.
# Check a file with: edgeinferd --check-config --config FILE

model:
  # Directory of the model bundle: model.onnx + model.yaml (+ model.sig once signing lands).
  bundle: /var/lib/edgeinfer/models/current
  # Synthetic frames run through each session before it serves (and before READY).
  warmup_runs: 3

# One entry per camera (at most 63).
streams:
  - name: cam0                 # letters, digits, '_' or '-'; results go to /dev/shm/edgeinfer.<name>.results
    # segment: edgeinfer.cam0  # the frame ring the producer creates (default edgeinfer.<name>)
    max_age_ms: 200            # frames older than this when their turn comes are dropped (counted "stale")
    priority: 0                # reserved for weighted scheduling; deadline order is used today
    pixel_format: bgr24        # gray8 | rgb24 | bgr24 | rgba32 | bgra32: with width/height, the session
    # width: 640               #   for this geometry is built and warmed at start (else on first frame)
    # height: 480

runtime:
  loop_cpus: []        # CPUs for the real-time loop thread (empty: the unit's / process's CPUs)
  ort_threads: 1       # ONNX Runtime intra-op threads, the loop thread included
  ort_cpus: []         # CPUs for the extra ORT threads (ort_threads - 1 of them), 0-based
  scheduling: fifo     # fifo | rr | other; falls back to other, loudly, when refused
  priority: 50         # 1..99 for fifo/rr
  duty_ceiling: 0.9    # the loop never keeps a CPU busier than this (avoids the kernel's RT throttle)
  spin_us: 0           # spin this long before sleeping on the doorbells (lower latency, burns CPU)
  idle_timeout_ms: 100 # longest sleep without frames (how often stream presence is rechecked)

shm:
  dir: /dev/shm
  allowed_uids: []     # producer uids whose segments are accepted (empty: any owner; mode checks apply)
  result_records: 64   # records kept per result ring
  result_group: null   # group of the result rings (default: the daemon's)

metrics:
  listen: 127.0.0.1:9464   # Prometheus /metrics and health (observability issue)
"""


def test_the_0_1_shipped_file_is_refused_until_it_says_whom_it_trusts(tmp_path):
    """0.1's file names no producer: any member of group edgeinfer could take cam0 before its camera does. It is
    refused (exit 2) with the stream's line and both ways out; with the trust stated it loads, warned about with
    the 0.1-only keys."""
    path = write(tmp_path, SHIPPED_0_1)
    r = check_config(path)
    assert r.returncode == 2, r.stderr
    assert (f"{path}:13: streams[0].name: stream cam0 names no producer: any member of group edgeinfer could take "
            f"it before its camera does") in r.stderr, r.stderr
    assert "producer: {user: CAMERA-USER}" in r.stderr and "trust_any_member: true" in r.stderr
    group = grp.getgrgid(os.getgid()).gr_name  # the package's group edgeinfer where this host has one
    trusted = SHIPPED_0_1.replace("    max_age_ms: 200 ", f"    producer: {{group: {group}, trust_any_member: true}}\n"
                                  "    max_age_ms: 200 ")
    path = write(tmp_path, trusted, "trusted.yaml")
    r = check_config(path)
    assert r.returncode == 0, r.stderr
    warned = [re.match(rf"edgeinferd: warning: {re.escape(path)}:(\d+): (\S+): ", x) for x in r.stderr.splitlines()]
    assert all(warned), r.stderr
    assert sorted((int(m[1]), m[2]) for m in warned) == [(15, "streams[0].producer"), (33, "shm.dir"),
                                                         (34, "shm.allowed_uids")]
    cfg = load_config(path)
    assert cfg.producer_of(cfg.streams[0]).group == group


def test_check_config_cli(tmp_path):
    ok = check_config(write(tmp_path, GOOD))
    assert ok.returncode == 0 and ok.stdout.strip().endswith(": OK") and ok.stderr == ""
    bad = check_config(write(tmp_path, GOOD.replace("fifo", "fast")))
    assert bad.returncode == 2 and "runtime.scheduling" in bad.stderr and ":8:" in bad.stderr


def test_repeated_key_is_an_error_with_both_lines(tmp_path):
    from edgeinfer.support.yamlconf import ConfigError, load_yaml_model
    from edgeinfer.config.schema import Config
    text = "model:\n  bundle: /a\n  warmup_runs: 1\n  warmup_runs: 5\nstreams:\n  - name: cam0\n"
    with pytest.raises(ConfigError) as e:
        load_yaml_model(Config, text, "c.yaml")
    assert e.value.problems == ["c.yaml:4: model.warmup_runs: repeated key (first given at line 3)"]


LAUGHS = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10 if i else ["x"] * 10) + "]\n" for i in range(10))


@pytest.mark.parametrize("extra, line, reason", [
    (LAUGHS, 8, "aliases expand to more than 100000 values"),              # 10^9 values from 400 bytes
    ("deep: " + "[" * 100_000 + "]" * 100_000 + "\n", 4, "nested more than 64 levels deep"),
    ("deep: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", 4, "nested more than 64 levels deep"),
    ("self: &s [*s]\n", 4, "alias *s inside its own anchor (a recursive structure)"),
    ("when: 2001-13-45\n", 4, "month must be in 1..12"),                   # was a bare ValueError, no file
    ("n: !!int 0xZZ\n", 4, "invalid literal for int() with base 16: 'ZZ'"),
])
def test_yaml_bombs_and_bad_scalars_are_refused_with_the_line(tmp_path, extra, line, reason):
    """Refused before a tree is built or walked (the key-line index walked aliases expanded: a billion
    laughs hung, deep nesting raised RecursionError), as `edgeinferd --check-config` is typed."""
    path = write(tmp_path, "model:\n  bundle: /tmp/bundle\n  warmup_runs: 1\n" + extra)
    r = check_config(path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"edgeinferd: {path}: invalid:", f"  {path}:{line}: not valid YAML: {reason}"], r.stderr


def test_aliases_within_the_bound_still_load():
    from edgeinfer.models.bundle import ModelMeta
    from edgeinfer.support.yamlconf import load_yaml_model
    text = ("name: m\nversion: '1'\ninput: {name: x, width: 8, height: 8}\ndecoder: {type: raw}\n"
            "preprocess: {mean: &m [0.5], std: *m}\nlabels: [a, b]\n")
    meta = load_yaml_model(ModelMeta, text, "m.yaml")
    assert meta.preprocess.mean == meta.preprocess.std == [0.5]


def test_a_long_list_of_problems_is_shown_in_part():
    from edgeinfer.models.bundle import ModelMeta
    from edgeinfer.support.yamlconf import ConfigError, load_yaml_model
    text = "name: m\nversion: '1'\ninput: {name: x, width: 8, height: 8}\ndecoder: {type: raw}\nlabels: [" + \
        ", ".join(["[]"] * 5000) + "]\n"
    with pytest.raises(ConfigError) as e:
        load_yaml_model(ModelMeta, text, "m.yaml")
    assert len(e.value.problems) == 5000
    lines = str(e.value).splitlines()
    assert len(lines) == 22 and lines[1] == "  m.yaml:5: labels[0]: Input should be a valid string" and \
        lines[-1] == "  ... and 4980 more"


def test_cli_default_sockets_are_ring_h_defaults():
    """edgeinferctl hard-codes the defaults (so that --help needs no native module): they must be ring.h's."""
    assert cli._INGRESS_SOCKET == ring.INGRESS_SOCKET
    assert cli._RESULTS_SOCKET == ring.RESULTS_SOCKET
