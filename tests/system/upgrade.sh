#!/bin/bash
# Runs inside a booted container (a oneshot unit): an operator's upgrade from 0.2.0 to this release through the
# project's signed apt repository, served over HTTP, as docs/operations/install-and-upgrade.md says it. One line
# per check in /out/results.txt ("PASS name detail" / "FAIL name detail"), then the container powers off.
#   /test/repo-0.2.0   the repository as published with 0.2.0 (scripts/make-repo)
#   /test/repo-0.3.0   the same repository after this release was added to it (same key, re-signed)
# The web server serves /srv/edgeinfer-repo, a link to what is published now: publishing 0.3.0 is moving it.
set -u
. /test/checks.sh  # R, pass, fail, check
finish() {  # on any exit: the journal kept, the container powered off (DONE is written at the script's end only)
    journalctl --no-pager -u edgeinferd -u edgeinfer-gateway -u edgeinfer-mqtt -u 'edgeinfer-camera@*' > /out/journal.txt 2>&1
    cp /tmp/apt-*.log /out/ 2>/dev/null
    systemctl poweroff --no-block; exit 0
}
trap finish EXIT
export DEBIAN_FRONTEND=noninteractive
PY=/opt/venvs/edgeinfer/bin/python
VERSION=$(cat /test/version)
read -r REPO_PORT MQTT_PORT < /test/ports
URL=http://127.0.0.1:$REPO_PORT
wait_active() { local u=${1:-edgeinferd} i; for i in $(seq 1 120); do [ "$(systemctl is-active "$u")" = active ] && return 0; sleep 0.5; done; return 1; }
installed() { dpkg-query -W -f='${Version}' edgeinfer 2>/dev/null; }
invocation() { systemctl show -P InvocationID "$1"; }
connects() { journalctl -u "edgeinfer-camera@$1" --no-pager -o cat | grep -c 'connected to edgeinferd'; }
sums() { md5sum /var/lib/edgeinfer/model-versions.json /var/lib/edgeinfer/known-good.json 2>/dev/null | awk '{print $1}' | tr '\n' ' '; }
decisions_before() { $PY - "$1" <<'PY'
import sqlite3, sys
db = sqlite3.connect("file:/var/lib/edgeinfer-mqtt/decisions.db?mode=ro", uri=True)
print(db.execute("SELECT COUNT(*) FROM decisions WHERE id <= ?", (int(sys.argv[1]),)).fetchone()[0])
PY
}
last_decision() { $PY -c 'import sqlite3; print(sqlite3.connect("file:/var/lib/edgeinfer-mqtt/decisions.db?mode=ro", uri=True).execute("SELECT COALESCE(MAX(id), 0) FROM decisions").fetchone()[0])'; }
# What `curl -fsSLo FILE URL` does (the container's minimal Debian has no curl).
fetch() { python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=10).read())' "$1" "$2"; }
# dpkg's conffile question, answered as an operator who keeps their file: N (and the line dpkg asked it with).
# `apt`, as the operator types it: `apt upgrade` installs what a new version newly depends on or recommends
# (edgeinfer-rtsp, decision record 0036), where `apt-get upgrade` holds the package back.
apt_keeping_mine() { local log=$1; shift; yes N | apt "$@" > "$log" 2>&1; }
asked() { grep -c "^Configuration file '$1'" "$2"; }

# ------------------------------------------------------------------ the repository, served as static files
# The container has its loopback only (decision record 0037): Debian's archive, which debootstrap left in
# sources.list, is out of reach, so it goes; apt sees the project's repository alone, and the packages' dependencies
# are the rootfs's.
rm -f /etc/apt/sources.list
ln -sfn /test/repo-0.2.0 /srv/edgeinfer-repo
systemd-run -q --unit=edgeinfer-repo-http python3 -m http.server "$REPO_PORT" --bind 127.0.0.1 --directory /srv/edgeinfer-repo
for _ in $(seq 1 40); do (exec 3<>/dev/tcp/127.0.0.1/"$REPO_PORT") 2>/dev/null && break; sleep 0.25; done

# ------------------------------------------------------------------ install 0.2.0 as the docs say: the repository first
add_repository() {
    install -d -m 0755 /etc/apt/keyrings
    fetch "$URL/edgeinfer-archive-keyring.pgp" /etc/apt/keyrings/edgeinfer.pgp || return 1
    fetch "$URL/edgeinfer.sources" /etc/apt/sources.list.d/edgeinfer.sources || return 1
    apt-get update -q > /tmp/apt-update-1.log 2>&1 || { tail -3 /tmp/apt-update-1.log; return 1; }
    local cand; cand=$(apt-cache policy edgeinfer | awk '/Candidate:/ {print $2}')
    echo "key and edgeinfer.sources from $URL; apt update: $(grep -c "$URL" /tmp/apt-update-1.log) line(s) from it; candidate $cand"
    [ "$cand" = 0.2.0 ] && ! grep -q '^W:\|^E:' /tmp/apt-update-1.log
}
check repository_added add_repository
check install_0_2_0 bash -c 'apt-get install -y -q edgeinfer > /tmp/apt-install.log 2>&1 && [ "$(dpkg-query -W -f="\${Version}" edgeinfer)" = 0.2.0 ] && echo "apt install edgeinfer: $(dpkg-query -W -f="\${Version}" edgeinfer)"'
[ "$(installed)" = 0.2.0 ] || exit 0

# ------------------------------------------------------------------ 0.2.0 serving: two camera units, gateway, bridge
useradd -m -G edgeinfer reader
mkdir -p /var/lib/edgeinfer/models /etc/edgeinfer/trust
cp -r /test/v1 /var/lib/edgeinfer/models/ && ln -sfn v1 /var/lib/edgeinfer/models/current
cp /test/trust/*.pub /etc/edgeinfer/trust/
chown -R edgeinfer:edgeinfer /var/lib/edgeinfer
edgeinferctl camera add gate1 --source synthetic --width 224 --height 224 --fps 10 > /dev/null
edgeinferctl camera add door --source synthetic --width 224 --height 224 --fps 10 > /dev/null
# The operator's edits of the shipped conffiles (dpkg asks about each at the upgrade).
cat > /etc/edgeinfer/edgeinferd.yaml <<'YAML'
# operator edit: two cameras, the gateway's pool, the bridge reads gate1
model: {bundle: /var/lib/edgeinfer/models/current}
streams:
  - name: gate1
    producer: {user: edgeinfer-cam-gate1}
    readers: {groups: [edgeinfer], users: [edgeinfer-mqtt]}
    width: 224
    height: 224
  - name: door
    producer: {user: edgeinfer-cam-door}
    readers: {groups: [edgeinfer]}
    width: 224
    height: 224
pools:
  gw: {model: default, user: edgeinfer-gw, streams: 2}
lanes: [{cpus: [0]}, {cpus: [1]}]
metrics: {ready_requires_stream: false}
YAML
mkdir -p /etc/mosquitto/conf.d
printf 'allow_anonymous true\nlistener %s 127.0.0.1\n' "$MQTT_PORT" > /etc/mosquitto/conf.d/edgeinfer-test.conf
systemctl start mosquitto
printf '# operator edit\nbroker:\n  host: 127.0.0.1\n  port: %s\nstreams:\n  gate1: {}\ndecisions: {results: true}\n' "$MQTT_PORT" \
    > /etc/edgeinfer/mqtt.yaml
serving_0_2_0() {
    systemctl restart edgeinferd && wait_active || return 1
    systemctl enable --now edgeinfer-camera@gate1 edgeinfer-camera@door edgeinfer-gateway edgeinfer-mqtt 2>/dev/null
    local u; for u in edgeinfer-camera@gate1 edgeinfer-camera@door edgeinfer-gateway edgeinfer-mqtt; do
        wait_active $u || { echo "$u: $(systemctl is-active $u)"; journalctl -u $u --no-pager -o cat | tail -3; return 1; }
    done
    runuser -u reader -- edgeinferctl results gate1 --count 3 --timeout 30 > /dev/null || return 1
    runuser -u reader -- edgeinferctl results door --count 3 --timeout 30 > /dev/null || return 1
    for _ in $(seq 1 60); do [ "$(last_decision)" -gt 0 ] && break; sleep 0.5; done
    echo "0.2.0: edgeinferd, 2 camera units, gateway, bridge active; results of gate1 and door; decision log rows $(last_decision)"
    [ "$(last_decision)" -gt 0 ]
}
check serving_0_2_0 serving_0_2_0

# ------------------------------------------------------------------ clients attached, then publish 0.3.0 and upgrade
install -m 0755 /test/gap.py /usr/local/bin/edgeinfer-gap
install -m 0755 /test/gwgap.py /usr/local/bin/edgeinfer-gwgap
rm -f /tmp/*.ready /tmp/upgrade.stop
# The clients run until /tmp/upgrade.stop (900 s at most: a bound, not a figure) and report their longest gaps.
runuser -u reader -- $PY /usr/local/bin/edgeinfer-gap gate1 900 /tmp/reader.ready /tmp/upgrade.stop > /tmp/reader-gap.json &
reader_pid=$!
runuser -u reader -- $PY /usr/local/bin/edgeinfer-gwgap default 900 /tmp/client.ready /tmp/upgrade.stop > /tmp/client-gap.json &
client_pid=$!
for _ in $(seq 1 120); do [ -e /tmp/reader.ready ] && [ -e /tmp/client.ready ] && break; sleep 0.5; done
c_gate1=$(connects gate1) c_door=$(connects door)
inv_d=$(invocation edgeinferd) inv_g=$(invocation edgeinfer-gateway) inv_m=$(invocation edgeinfer-mqtt)
state_before=$(sums)
cfg_before=$(md5sum < /etc/edgeinfer/edgeinferd.yaml) mqtt_cfg_before=$(md5sum < /etc/edgeinfer/mqtt.yaml)
rows_before=$(last_decision)
ln -sfn /test/repo-0.3.0 /srv/edgeinfer-repo.new && mv -T /srv/edgeinfer-repo.new /srv/edgeinfer-repo  # published
upgrade() {
    apt-get update -q > /tmp/apt-update-2.log 2>&1 || { tail -3 /tmp/apt-update-2.log; return 1; }
    apt_keeping_mine /tmp/apt-upgrade.log upgrade -y -q || { tail -5 /tmp/apt-upgrade.log; return 1; }
    wait_active edgeinferd && wait_active edgeinfer-gateway && wait_active edgeinfer-mqtt || return 1
    # PyAV moved to edgeinfer-rtsp (decision record 0036): the new Recommends, installed by the upgrade itself
    local rtsp; rtsp=$(dpkg-query -W -f='${Version}' edgeinfer-rtsp 2>/dev/null)
    local av=absent; /opt/venvs/edgeinfer/bin/python -c 'import av' 2>/dev/null && av=present
    echo "apt update && apt upgrade: $(grep -o 'edgeinfer (0.2.0) over (.*)\|Unpacking edgeinfer ([^)]*) over ([^)]*)' /tmp/apt-upgrade.log | head -1); now $(installed); edgeinfer-rtsp ${rtsp:-not installed}, PyAV $av"
    [ "$(installed)" = "$VERSION" ] && [ "$rtsp" = "$VERSION" ] && [ $av = present ]
}
check upgrade_0_2_0_to_this upgrade
# The clients: one more answer each after the restarts, then their figures.
runuser -u reader -- edgeinferctl results gate1 --count 3 --timeout 60 > /dev/null
touch /tmp/upgrade.stop
for p in $reader_pid $client_pid; do for _ in $(seq 1 120); do kill -0 $p 2>/dev/null || break; sleep 0.5; done; kill $p 2>/dev/null; done
wait 2>/dev/null
cameras_never_reconnect() {
    local g=$(( $(connects gate1) - c_gate1 )) d=$(( $(connects door) - c_door ))
    local active=$(systemctl is-active edgeinfer-camera@gate1 edgeinfer-camera@door | tr '\n' ' ')
    echo "camera reconnections across the upgrade: gate1 $g, door $d (units $active; NRestarts $(systemctl show -P NRestarts edgeinfer-camera@gate1) $(systemctl show -P NRestarts edgeinfer-camera@door)); daemon restarted: $([ "$(invocation edgeinferd)" != "$inv_d" ] && echo yes || echo no)"
    [ $g = 0 ] && [ $d = 0 ] && [ "$active" = "active active " ] && [ "$(invocation edgeinferd)" != "$inv_d" ]
}
check cameras_never_reconnect cameras_never_reconnect
started_at() { systemctl show -P ExecMainStartTimestampMonotonic "$1"; }
clients_bounded_gap() {
    local r c g d; r=$(cat /tmp/reader-gap.json) c=$(cat /tmp/client-gap.json)
    g=$(started_at edgeinfer-gateway) d=$(started_at edgeinferd)
    echo "reader of gate1: $r; gateway client (tritonclient, one request at a time): $c; gateway restarted: $([ "$(invocation edgeinfer-gateway)" != "$inv_g" ] && echo yes || echo no) (before the daemon: $([ "$g" -lt "$d" ] && echo yes || echo no)), bridge restarted: $([ "$(invocation edgeinfer-mqtt)" != "$inv_m" ] && echo yes || echo no)"
    # The new gateway (UNAVAILABLE at once while no daemon serves) is the one clients meet during the daemon's
    # restart: the postinst restarts it first. The gaps and failure codes are figures (docs/performance.md).
    [ "$(invocation edgeinfer-gateway)" != "$inv_g" ] && [ "$(invocation edgeinfer-mqtt)" != "$inv_m" ] && [ "$g" -lt "$d" ] || return 1
    $PY - "$r" "$c" <<'PY'
import json, sys
r, c = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert r["results"] > 0 and r["attaches"] >= 2, r   # the reader came back through the restarted daemon
assert c["answers"] > 0, c                          # and the client through the restarted gateway and daemon
PY
}
check clients_bounded_gap clients_bounded_gap
conffiles_kept() {
    local a b
    a=$(asked /etc/edgeinfer/edgeinferd.yaml /tmp/apt-upgrade.log) b=$(asked /etc/edgeinfer/mqtt.yaml /tmp/apt-upgrade.log)
    echo "dpkg asked about edgeinferd.yaml: $a, mqtt.yaml: $b (kept: $([ "$(md5sum < /etc/edgeinfer/edgeinferd.yaml)" = "$cfg_before" ] && echo yes || echo no), $([ "$(md5sum < /etc/edgeinfer/mqtt.yaml)" = "$mqtt_cfg_before" ] && echo yes || echo no); the new ones beside them: $(ls /etc/edgeinfer/*.dpkg-dist 2>/dev/null | tr '\n' ' '))"
    [ "$a" = 1 ] && [ "$b" = 1 ] && [ "$(md5sum < /etc/edgeinfer/edgeinferd.yaml)" = "$cfg_before" ] && \
        [ "$(md5sum < /etc/edgeinfer/mqtt.yaml)" = "$mqtt_cfg_before" ] && [ -e /etc/edgeinfer/edgeinferd.yaml.dpkg-dist ] && \
        [ -e /etc/edgeinfer/mqtt.yaml.dpkg-dist ] && ! grep -q "^Configuration file '/etc/edgeinfer/gateway.yaml'" /tmp/apt-upgrade.log
}
check conffiles_kept conffiles_kept
state_carried_over() {
    local kept; kept=$(decisions_before "$rows_before")
    echo "anti-rollback and known-good files: $([ "$(sums)" = "$state_before" ] && echo unchanged || echo changed); decision log: $kept of the $rows_before rows from 0.2.0 kept, $(last_decision) now; served version $(runuser -u reader -- edgeinferctl results gate1 --count 1 --timeout 30 | grep -o '"version": "[^"]*"' | head -1)"
    [ "$(sums)" = "$state_before" ] && [ "$kept" = "$rows_before" ] && [ "$(last_decision)" -gt "$rows_before" ]
}
check state_carried_over state_carried_over

# ------------------------------------------------------------------ and back: apt install edgeinfer=0.2.0
downgrade() {
    local c_g=$(connects gate1) c_d=$(connects door) inv=$(invocation edgeinferd)
    apt_keeping_mine /tmp/apt-downgrade.log install -y -q --allow-downgrades edgeinfer=0.2.0 || { tail -5 /tmp/apt-downgrade.log; return 1; }
    wait_active edgeinferd && wait_active edgeinfer-gateway && wait_active edgeinfer-mqtt || return 1
    local r; r=$(runuser -u reader -- edgeinferctl results gate1 --count 3 --timeout 60 | wc -l)
    local g=$(( $(connects gate1) - c_g )) d=$(( $(connects door) - c_d ))
    # edgeinfer-rtsp removed by apt (it depends on this release's edgeinfer); 0.2.0's own package has PyAV again
    local rtsp; rtsp=$(dpkg-query -W -f='${db:Status-Status}' edgeinfer-rtsp 2>/dev/null)
    local av=absent; /opt/venvs/edgeinfer/bin/python -c 'import av' 2>/dev/null && av=present
    echo "apt install edgeinfer=0.2.0: now $(installed); daemon restarted: $([ "$(invocation edgeinferd)" != "$inv" ] && echo yes || echo no); camera reconnections $g, $d; results after: $r; state files $([ "$(sums)" = "$state_before" ] && echo unchanged || echo changed); edgeinfer-rtsp ${rtsp:-gone}, PyAV $av"
    [ "$(installed)" = 0.2.0 ] && [ $r = 3 ] && [ $g = 0 ] && [ $d = 0 ] && [ "$(sums)" = "$state_before" ] && \
        [ "${rtsp:-not-installed}" != installed ] && [ $av = present ]
}
check downgrade_to_0_2_0 downgrade
echo DONE >> $R
