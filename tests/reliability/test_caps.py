"""Isolation: caps that hold across uids (issue 23, attacks B and G), played by real unprivileged users and by
one user's subordinate uids in a user namespace, against a live daemon serving an honest camera and reader.

B: four group members holding silent connections filled the one pool of handshakes that both sockets shared
(16, a quarter per user): an honest camera was refused 8 of 8 times, readers 24 of 24; one user did the same
alone through 5 of its subordinate uids. G: 255 reader connections held on one group-readable stream left
another stream's reader refused, and held reader connections never timed out.

The arena is test_isolation's (its own daemon here), with three more streams: `crowd1` and `crowd2`, readable
by the whole group, and `quiet`, read by cam_a alone; its caps are set so that a test fills them in seconds
(docs/operations/tuning.md has the defaults). The attackers are evil_reader.c's `silent` (connections that never
say hello, reopened as fast as the daemon closes them) and `hold` (reader connections kept open).
"""
from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request

import pytest

from conftest import Children, read_line
from daemon_helpers import daemon_log, poll
from test_isolation import ATTACKER_STREAMS, H, W, Arena, Watch, row

CAPS = {"max_pending": 16, "max_pending_per_user": 2, "max_readers": 96, "max_readers_per_stream": 48,
        "max_readers_per_user": 32, "reader_idle_s": 3.0}
SILENT_S = 8  # how long each silent attacker keeps at it: the honest clients come in meanwhile


@pytest.fixture(scope="module")
def arena(tmp_path_factory, users, sandbox, signing_key, c_producer, c_reader):
    more = [{"name": n, "width": W, "height": H, "producer": f"{{user: {users.cam_a}}}",
             "readers": f"{{groups: [{users.group}]}}"} for n in ("crowd1", "crowd2")]
    more.append({"name": "quiet", "width": W, "height": H, "producer": f"{{user: {users.cam_a}}}",
                 "readers": f"{{users: [{users.cam_a}]}}"})
    a = Arena(tmp_path_factory.mktemp("caps"), users, sandbox, signing_key, c_producer, c_reader,
              more_streams=more, ingress=CAPS)
    try:
        yield a
    finally:
        a.close()


def kv(text: str) -> dict:
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)


def metric(url: str, family: str, **labels) -> float:
    """One sample's value from /metrics (0 if absent)."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics", timeout=5) as f:
        text = f.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name in (family, family + "_total") and all(s.labels.get(k) == v for k, v in labels.items()))


def pending_refusals(arena: Arena) -> float:
    return metric(arena.daemon.metrics_url, "edgeinfer_ingress_refusals", reason="too_many_pending")


def honest_clients(arena: Arena, users, c_producer, c_reader) -> tuple[str, float, str]:
    """The honest camera (cam_a, its stream `spare` free) and a new honest reader of another stream (cam_a
    reading `quiet`), each with its wait bounded: (camera's first line, seconds to it, reader's output)."""
    children = Children()
    try:
        started = time.monotonic()
        cam = children.spawn([*users.run_as(users.cam_a), c_producer, "spare", str(W), str(H), "--socket",
                              arena.ingress, "--frames", "10", "--fps", "50", "--wait", "10"], cwd="/")
        first = read_line(cam, timeout=30)
        took = time.monotonic() - started
        rd = subprocess.run([*users.run_as(users.cam_a), c_reader, "quiet", "--socket", arena.results, "--count", "1",
                             "--timeout", "1"], capture_output=True, text=True, timeout=60, cwd="/")
        cam.wait(30)
    finally:
        children.cleanup()
    return first, took, rd.stdout + rd.stderr


def silent_attack(arena: Arena, cmd_for) -> list[subprocess.Popen]:
    """Silent attackers on both sockets; returns once the daemon has refused some of them for a full pool
    (the caps are contested), or after 10 s."""
    before = pending_refusals(arena)
    procs = [subprocess.Popen(cmd_for(sock), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
             for sock in (arena.ingress, arena.results)]
    poll(lambda: pending_refusals(arena) > before, 10, 0.1)
    return procs


def finish(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=SILENT_S + 60)[0])
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def test_four_users_holding_silent_connections_cannot_lock_out_a_camera_or_a_reader(request, matrix, arena, users,
                                                                                     c_producer, c_reader):
    """The issue (B): four group members holding 4 silent connections each filled the shared pool: the honest
    camera was refused 8 of 8 times. Now the pools are per socket; a party holds at most max_pending_per_user (2)
    handshakes on each, or as many as the streams it is named for there (issue 35 item 7: a front's pool connects
    all its streams at once), so cam_b, named for each of its attack streams, opens two more than those; a
    connection to the ingress socket from a uid that may produce nothing is refused before its hello, and a uid
    named as a producer or reader has a slot past the pool."""
    w = Watch(arena)
    attackers = [users.cam_b, users.reader, *users.more]
    assert len(attackers) == 4
    count = {u: 6 for u in attackers} | {users.cam_b: len(ATTACKER_STREAMS) + 2}  # past each one's cap
    procs, per = [], {}
    try:
        for u in attackers:
            ps = silent_attack(arena, lambda sock, u=u: [*users.run_as(u), arena.tools["evil_reader"], "--socket",
                                                         sock, "--attack", "silent", "--count", str(count[u]),
                                                         "--seconds", str(SILENT_S)])
            procs.extend(ps)
            per[u] = ps
        first, took, rd = honest_clients(arena, users, c_producer, c_reader)
    finally:
        outs = finish(procs)
    ok, text = w.verdict()
    got = {(u, k): kv(outs[procs.index(p)]) for u in attackers for k, p in zip(("ingress", "results"), per[u])}
    said = {f"{u[-1]}/{k}": f"{int(v.get('CONNECTS', 0))} connects, AGAIN {v.get('AGAIN')}, DENIED {v.get('DENIED')}"
            for (u, k), v in got.items()}
    non_producers_denied = all(int(got[(u, "ingress")].get("DENIED", 0)) > 0 and
                               int(got[(u, "ingress")].get("AGAIN", 0)) == 0 for u in attackers[1:])
    capped = all(int(got[(u, "results")].get("AGAIN", 0)) > 0 for u in attackers) and \
        int(got[(users.cam_b, "ingress")].get("AGAIN", 0)) > 0
    admitted = first == "CONNECTED accepted=1"
    attached = "ATTACHED" in rd
    observed = (f"4 group members, silent connections on each socket ({count[users.cam_b]} of cam_b, 6 of the others), "
                f"reopened for {SILENT_S} s: {said}; "
                f"meanwhile the honest camera (stream free): {first!r} after {took:.2f} s; a new reader of another "
                f"stream: attached {attached}; {text}")
    row(matrix, request, "four group members hold silent connections on both sockets up to their caps",
        2 * sum(count.values()),
        "refused past each party's cap per socket (2, or the streams it is named for; non-producers at once on the "
        "ingress socket); the honest camera and a new reader of another stream admitted", observed,
        admitted and attached and non_producers_denied and capped and ok)


def subordinate_range(user: str) -> tuple[int, int] | None:
    """(first, count) of `user`'s subordinate uids in /etc/subuid (Debian's useradd writes them when the file
    exists: the uidmap package creates it)."""
    try:
        with open("/etc/subuid") as f:
            for ln in f:
                name, start, count = ln.strip().split(":")
                if name == user:
                    return int(start), int(count)
    except (OSError, ValueError):
        return None
    return None


def in_namespace(users, user: str, n: int, per_child: str, after: str = "") -> list[str]:
    """The command that runs `per_child` (a shell command, $K its inner uid) as n subordinate uids of `user`,
    in parallel: `user` makes a user namespace mapping inner uids 0..n to its subordinate uids (newuidmap,
    no root), and inner root starts each child with setresuid(K) and its groups kept (the host's group still
    opens the 0660 sockets). Each child's output lines are prefixed with its K. `after`: the next child starts
    once this one has printed a line starting with `after` (or after 20 s)."""
    uid0, _ = subordinate_range(user)
    with open("/etc/subgid") as f:
        gid0 = next(int(ln.split(":")[1]) for ln in f if ln.split(":")[0] == user)
    wait = (f"n=0; until grep -q \"^$K:{after}\" $F || [ $n -ge 400 ]; do sleep 0.05; n=$((n + 1)); done; "
            if after else "")
    script = (f"F=$(mktemp); for K in $(seq 1 {n}); do (setpriv --reuid=$K --regid=$K --keep-groups {per_child} | "
              f"sed -u \"s/^/$K:/\" >> $F) & {wait}done; wait; cat $F; rm -f $F")
    return [*users.run_as(user), "unshare", f"--map-users={uid0},0,{n + 1}", f"--map-groups={gid0},0,{n + 1}",
            "--setuid", "0", "sh", "-c", script]


def by_child(out: str) -> dict[str, dict]:
    got: dict[str, dict] = {}
    for ln in out.splitlines():
        k, _, rest = ln.partition(":")
        if "=" in rest:
            key, _, v = rest.partition("=")
            got.setdefault(k, {})[key] = v
    return got


def test_one_users_subordinate_uids_count_as_one_party(request, matrix, arena, users, c_producer, c_reader):
    """The issue (B, G): one user, through 5 of its subordinate uids (a user namespace: no root needed with
    uidmap), filled the pool alone; the children keep the user's groups, so the 0660 sockets still open.
    Uids outside the host's user database are one party now: together they hold at most 2 handshakes per
    socket and max_readers_per_user reader connections; as producers of nothing they are refused on the
    ingress socket before their hello."""
    user, n = users.more[0], 5
    if subordinate_range(user) is None:
        pytest.skip(f"{user} has no subordinate uids in /etc/subuid (the uidmap package creates the file; "
                    f"`make test` installs it before the users are made)")
    probe = subprocess.run(in_namespace(users, user, 1, "id -u"), capture_output=True, text=True, timeout=30,
                           cwd="/")
    if probe.returncode != 0 or "1:" not in probe.stdout:
        pytest.skip(f"an unprivileged user namespace is not allowed here: {probe.stderr.strip()[-200:]!r}")
    w = Watch(arena)
    tool = arena.tools["evil_reader"]
    procs = silent_attack(arena, lambda sock: in_namespace(
        users, user, n, f"{tool} --socket {sock} --attack silent --count 6 --seconds {SILENT_S}"))
    try:
        first, took, rd = honest_clients(arena, users, c_producer, c_reader)
    finally:
        outs = finish(procs)
    # One child after the other (each has done its 20 handshakes when the next starts): the party's handshake
    # cap is not what stops them here, its reader cap is.
    hold = subprocess.run(in_namespace(users, user, n, f"{tool} --socket {arena.results} --stream crowd2 "
                                                       f"--attack hold --count 20 --seconds 15", after="REFUSED="),
                          capture_output=True, text=True, timeout=120, cwd="/")
    ok, text = w.verdict()
    ingress, results, held = by_child(outs[0]), by_child(outs[1]), by_child(hold.stdout)
    total = {what: {k: sum(int(c.get(k, 0)) for c in got.values()) for k in ("CONNECTS", "AGAIN", "DENIED")}
             for what, got in (("ingress", ingress), ("results", results))}
    accepted = sum(int(c.get("ACCEPTED", 0)) for c in held.values())
    capped = sum("reader connections (ingress.max_readers_per_user)" in c.get("FIRST_REFUSAL", "")
                 and "outside the user database" in c.get("FIRST_REFUSAL", "") for c in held.values())
    seen_uids = sorted(set(int(u) for u in re.findall(r"uid (\d+) \(\?\)", daemon_log(arena.daemon))))
    sub0, _ = subordinate_range(user)
    outside = [u for u in seen_uids if sub0 < u <= sub0 + n]
    admitted = first == "CONNECTED accepted=1"
    attached = "ATTACHED" in rd
    observed = (f"{user} as {n} subordinate uids ({len(ingress)}+{len(results)} children answered; the daemon logged "
                f"uids {outside}): ingress {total['ingress']}, results {total['results']}; then {n} x 20 reader "
                f"connections held on a group-readable stream: {accepted} accepted (one party's cap "
                f"{CAPS['max_readers_per_user']}; {capped} children refused for it); the honest camera: {first!r} after {took:.2f} s; a new reader of "
                f"another stream attached {attached}; {text}")
    row(matrix, request, "one user holds silent connections and reader connections through 5 subordinate uids",
        n * (2 * 6 + 20), "the subordinate uids count as one party: its caps, not 5 times them; the honest camera "
        "and a new reader admitted", observed,
        admitted and attached and len(ingress) == n and len(results) == n and total["ingress"]["DENIED"] > 0
        and total["ingress"]["AGAIN"] == 0 and total["results"]["AGAIN"] > 0
        and accepted == CAPS["max_readers_per_user"] and capped >= 3 and ok)


def test_one_streams_readers_cannot_lock_out_another_streams_and_idle_ones_give_way(request, matrix, arena, users,
                                                                                     c_reader):
    """The issue (G): 255 reader connections held on one group-readable stream left another stream's reader
    refused ("256 readers connected"), and held connections never timed out. Now a stream holds at most
    max_readers_per_stream, a stream's first 4 pass the total cap, and where a shared cap is full the biggest
    holder's oldest connection held past reader_idle_s gives way to a new reader."""
    w = Watch(arena)
    url = arena.daemon.metrics_url
    attackers = [users.cam_b, users.reader, *users.more]
    tool = arena.tools["evil_reader"]
    children = Children()
    outs = {}
    gave0 = metric(url, "edgeinfer_ingress_refusals", reason="gave_way")
    try:
        # 255 on crowd1 (64 + 64 + 64 + 63), then the same users on crowd2 until the total cap is reached.
        for u, count in zip(attackers, (64, 64, 64, 63)):
            p = children.spawn([*users.run_as(u), tool, "--socket", arena.results, "--stream", "crowd1", "--attack",
                                "hold", "--count", str(count), "--seconds", "30"], cwd="/")
            outs[("crowd1", u)] = (p, read_line(p, 60), read_line(p, 10))
        crowd1 = metric(url, "edgeinfer_stream_readers", stream="crowd1")
        for u in attackers[2:]:
            p = children.spawn([*users.run_as(u), tool, "--socket", arena.results, "--stream", "crowd2", "--attack",
                                "hold", "--count", "48", "--seconds", "30"], cwd="/")
            outs[("crowd2", u)] = (p, read_line(p, 60), read_line(p, 10))
        # Their connections are admitted as the daemon's loop takes them in: look again for a while (bounded).
        deadline = time.monotonic() + 15
        while (held_all := metric(url, "edgeinfer_stream_readers")) < CAPS["max_readers"] and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        quiet = subprocess.run([*users.run_as(users.cam_a), c_reader, "quiet", "--socket", arena.results, "--count",
                                "1", "--timeout", "1"], capture_output=True, text=True, timeout=60, cwd="/")
        # Past reader_idle_s, a newcomer on the full stream: the biggest holder's oldest connection gives way.
        time.sleep(CAPS["reader_idle_s"] + 0.5)
        newcomer = subprocess.run([*users.run_as(users.cam_a), c_reader, "crowd1", "--socket", arena.results,
                                   "--count", "1", "--timeout", "1"], capture_output=True, text=True, timeout=60,
                                  cwd="/")
        gave = metric(url, "edgeinfer_ingress_refusals", reason="gave_way") - gave0
        crowd1_after = metric(url, "edgeinfer_stream_readers", stream="crowd1")
    finally:
        children.cleanup()
    ok, text = w.verdict()
    accepted = {k: int(kv("\n".join(v[1:])).get("ACCEPTED", 0)) for k, v in outs.items()}
    on1 = sum(v for (s, _), v in accepted.items() if s == "crowd1")
    first_refusal = next((v[1] for k, v in outs.items() if k[0] == "crowd1" and v[1].startswith("FIRST_REFUSAL")), "")
    logged = "gave way to a new reader" in daemon_log(arena.daemon) or "closed for a new reader" in \
        daemon_log(arena.daemon)
    quiet_in, newcomer_in = "ATTACHED" in quiet.stdout, "ATTACHED" in newcomer.stdout
    observed = (f"255 reader connections asked on group-readable crowd1 by 4 users: {on1} accepted (per stream "
                f"{CAPS['max_readers_per_stream']}; first refusal {first_refusal[:110]!r}), the daemon held "
                f"{crowd1:.0f}; then crowd2 until {held_all:.0f} held in all (max_readers {CAPS['max_readers']}); a "
                f"new reader of another stream: attached {quiet_in}; after reader_idle_s "
                f"{CAPS['reader_idle_s']:g} s a new reader of crowd1: attached {newcomer_in}, {gave:.0f} held "
                f"connections gave way (logged {logged}), crowd1 holds {crowd1_after:.0f}; {text}")
    row(matrix, request, "255 reader connections held on one group-readable stream, then another until the total cap",
        255 + 96, "capped per stream; another stream's reader admitted at the total cap; past reader_idle_s the "
        "biggest holder's oldest connection gives way to a new reader", observed,
        on1 >= CAPS["max_readers_per_stream"] and crowd1 == CAPS["max_readers_per_stream"]
        and held_all >= CAPS["max_readers"] and quiet_in and newcomer_in and gave >= 1 and logged
        and crowd1_after <= CAPS["max_readers_per_stream"] and ok)


@pytest.mark.parametrize("client", ["ResultReader", "examples/reader.c"])
def test_a_reader_that_gave_way_reads_on_where_it_was(request, matrix, tmp_path, stream, users, sandbox, signing_key,
                                                       c_producer, c_reader, client):
    """The other side of the idle bound: a reader whose held connection gave way to a new reader sees its
    connection closed. It connects again, is handed the same ring (the same memfd: the same daemon), and
    reads on where it was: no record twice (both clients used to read the ring again from its start)."""
    from rel_helpers import Lines, fault_daemon

    from edgeinfer.abi import ring
    children = Children()
    ingress = {"socket": sandbox / f"{stream}-in.sock", "results_socket": sandbox / f"{stream}-res.sock",
               "socket_group": users.group, "max_readers_per_stream": 2, "reader_idle_s": 0.5}
    proc, _, _ = fault_daemon(children, tmp_path, signing_key, stream, ingress=ingress,
                              stream_keys={"readers": f"{{users: [{os.getuid()}], groups: [{users.group}]}}"})
    first = second = None
    numbers, attaches, missed = [], 0, 0
    try:
        cam = children.spawn([c_producer, stream, str(W), str(H), "--fps", "50", "--socket", proc.ingress])
        assert read_line(cam) == "CONNECTED accepted=1"
        if client == "ResultReader":  # the oldest connection of this user: it gives way
            first = ring.ResultReader.connect(stream, socket=proc.results)

            def read_some(n: int, timeout: float) -> None:
                end, got = time.monotonic() + timeout, 0
                while got < n and time.monotonic() < end:
                    rec = first.read(0.2)
                    if rec is not None:
                        numbers.append(rec.number)
                        got += 1
        else:
            first_c = Lines(children.spawn([c_reader, stream, "--socket", proc.results, "--count", "100"]))

            def read_some(n: int, timeout: float) -> None:
                nonlocal attaches, missed
                end, got = time.monotonic() + timeout, 0
                while got < n and time.monotonic() < end:
                    line = first_c.next(max(end - time.monotonic(), 0.1)) or ""
                    attaches += line.startswith("ATTACHED")
                    if line.startswith("RESULT"):
                        f = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
                        numbers.append(int(f["n"]))
                        missed = int(f["missed"])
                        got += 1
        read_some(40, 20)  # while reading, it holds its connection longer than reader_idle_s
        second = ring.ResultReader.connect(stream, socket=proc.results)  # this user's second: the stream is full
        newcomer = subprocess.run([*users.run_as(users.reader), c_reader, stream, "--socket", proc.results, "--count",
                                   "5", "--timeout", "10"], capture_output=True, text=True, timeout=60, cwd="/")
        read_some(60, 30)  # across its reconnection
        gave = metric(proc.metrics_url, "edgeinfer_ingress_refusals", reason="gave_way")
        if first is not None:
            attaches, missed = first.attach_count, first.missed
    finally:
        for r in (first, second):
            if r is not None:
                r.close()
        children.cleanup()
    twice = len(numbers) - len(set(numbers))
    in_order = all(b > a for a, b in zip(numbers, numbers[1:]))
    gaps = sum(b - a - 1 for a, b in zip(numbers, numbers[1:]))
    observed = (f"{client}: its connection gave way to another user's new reader ({gave:.0f} counted; the newcomer "
                f"attached {'ATTACHED' in newcomer.stdout}); it attached {attaches} times, read {len(numbers)} records "
                f"(n={numbers[0] if numbers else '-'}..{numbers[-1] if numbers else '-'}): {twice} read twice, in "
                f"order {in_order}, {gaps} skipped ({missed} counted missed)")
    row(matrix, request, f"a reader's held connection gives way to a new reader (reader_idle_s; {client})", 1,
        "the reader connects again and reads on where it was: no record twice, every skip counted", observed,
        gave >= 1 and "ATTACHED" in newcomer.stdout and attaches >= 2 and len(numbers) >= 100 and twice == 0
        and in_order and gaps <= missed)
