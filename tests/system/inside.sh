#!/bin/bash
# Runs inside the booted container (a oneshot unit), writes one line per check to
# /out/results.txt ("PASS name detail" / "FAIL name detail"), then powers off.
set -u
R=/out/results.txt
: > $R
pass() { echo "PASS $1 ${2:-}" >> $R; }
fail() { echo "FAIL $1 ${2:-}" >> $R; }
check() { local name=$1; shift; if out=$("$@" 2>&1); then pass "$name" "$(echo "$out" | tail -1)"; else fail "$name" "$(echo "$out" | tail -3 | tr '\n' ' ')"; fi; }
wait_active() { for _ in $(seq 1 120); do [ "$(systemctl is-active edgeinferd)" = active ] && return 0; sleep 0.5; done; return 1; }
finish() { journalctl -u edgeinferd --no-pager > /out/journal.txt 2>&1; echo DONE >> $R; systemctl poweroff --no-block; exit 0; }
trap finish EXIT

export DEBIAN_FRONTEND=noninteractive
check install apt-get install -y -q /test/edgeinfer.deb
check user_and_group getent group edgeinfer
check no_bundle_no_crash_loop bash -c '[ "$(systemctl is-active edgeinferd)" != failed ] && ! systemctl is-failed -q edgeinferd'

# A model bundle, its trust key, a config, and a test drop-in: short watchdog, fault hook on.
mkdir -p /var/lib/edgeinfer/models /etc/edgeinfer/trust /etc/systemd/system/edgeinferd.service.d
cp -r /test/v1 /test/v2 /var/lib/edgeinfer/models/
ln -sfn /var/lib/edgeinfer/models/v1 /var/lib/edgeinfer/models/current
cp /test/trust/*.pub /etc/edgeinfer/trust/
cp /test/edgeinferd.yaml /etc/edgeinfer/edgeinferd.yaml
chown -R edgeinfer:edgeinfer /var/lib/edgeinfer
printf '[Service]\nWatchdogSec=3\nCPUAffinity=0 1\n' > /etc/systemd/system/edgeinferd.service.d/test.conf
systemctl daemon-reload
check verify_unit systemd-analyze verify /lib/systemd/system/edgeinferd.service
systemd-analyze security edgeinferd.service > /out/security.txt 2>&1
check start bash -c 'systemctl start edgeinferd && sleep 1 && systemctl is-active edgeinferd'
pid=$(systemctl show -P MainPID edgeinferd)
tid=$(ps -L -o tid=,comm= -p "$pid" | awk '$2=="edgeinfer-rt"{print $1}')
check loop_is_fifo bash -c "chrt -p $tid | grep -q SCHED_FIFO && chrt -p $tid"
check loop_affinity bash -c "taskset -cp $tid | grep -q 'list: 1\$' && taskset -cp $tid"

# A producer in group edgeinfer feeds frames; results come back.
useradd -m -G edgeinfer cam
useradd -m outsider
runuser -u cam -- edgeinferctl feed --synthetic --stream cam0 --width 224 --height 224 --fps 20 --group edgeinfer &
feeder=$!
check results_from_group_member runuser -u cam -- edgeinferctl results cam0 --count 5 --timeout 30
kill $feeder; wait $feeder 2>/dev/null

# Reload swaps the model: flip current, systemctl reload.
runuser -u cam -- edgeinferctl feed --synthetic --stream cam0 --width 224 --height 224 --fps 20 --group edgeinfer &
feeder=$!
ln -sfn /var/lib/edgeinfer/models/v2 /var/lib/edgeinfer/models/current.new && mv -T /var/lib/edgeinfer/models/current.new /var/lib/edgeinfer/models/current
check reload bash -c 'systemctl reload edgeinferd && sleep 3 && runuser -u cam -- edgeinferctl results cam0 --count 3 --timeout 20 | tail -1 | grep "\"version\": \"0.0.12\""'
kill $feeder; wait $feeder 2>/dev/null

# A producer outside the group: its segment (its own group, 0660) is not readable by the daemon.
runuser -u outsider -- edgeinferctl feed --synthetic --stream cam1 --width 64 --height 64 --fps 20 &
outsider=$!
sleep 3
ls -l /dev/shm >> /out/shm.txt
# The daemon's result ring for cam1 exists, but no result comes: the outsider's segment is not readable.
check outsider_refused bash -c 'out=$(runuser -u cam -- edgeinferctl results cam1 --count 1 --timeout 3) && [ -z "$out" ] && ls -l /dev/shm/edgeinfer.cam1'
kill $outsider; wait $outsider 2>/dev/null

# A hung loop is restarted by the watchdog.
before=$(systemctl show -P NRestarts edgeinferd)
kill -USR1 "$(systemctl show -P MainPID edgeinferd)"
check watchdog_restart bash -c "for i in \$(seq 1 40); do [ \$(systemctl show -P NRestarts edgeinferd) -gt $before ] && wait_active_again=1 && break; sleep 0.5; done; [ \"\${wait_active_again:-0}\" = 1 ] && systemctl show -P NRestarts edgeinferd"
wait_active

# SIGKILL under load: systemd restarts the daemon (Restart=on-failure); the producer is untouched,
# results resume, and /dev/shm holds the same names as before (no leaked segment).
runuser -u cam -- edgeinferctl feed --synthetic --stream cam0 --width 224 --height 224 --fps 20 --group edgeinfer &
feeder=$!
runuser -u cam -- edgeinferctl results cam0 --count 1 --timeout 30 > /dev/null
shm_before=$(ls -A /dev/shm | sort | tr '\n' ' ')
resumed=0
for i in 1 2 3; do
  before=$(systemctl show -P NRestarts edgeinferd)
  kill -KILL "$(systemctl show -P MainPID edgeinferd)"
  for _ in $(seq 1 60); do
    [ "$(systemctl show -P NRestarts edgeinferd)" -gt "$before" ] && [ "$(systemctl is-active edgeinferd)" = active ] && break
    sleep 0.5
  done
  runuser -u cam -- edgeinferctl results cam0 --count 1 --timeout 30 | grep -q '"frame_id"' && resumed=$((resumed + 1))
done
shm_after=$(ls -A /dev/shm | sort | tr '\n' ' ')
check daemon_sigkill_restart bash -c "[ $resumed = 3 ] && kill -0 $feeder && [ '$shm_before' = '$shm_after' ] && echo 'kills=3 restarts=3 resumed=$resumed producer_alive=yes shm_unchanged=[$shm_after]'"
kill $feeder; wait $feeder 2>/dev/null
check stop bash -c 'systemctl stop edgeinferd && [ "$(systemctl show -P ExecMainStatus edgeinferd)" = 0 ] && [ "$(systemctl is-active edgeinferd)" = inactive ]'
check purge bash -c 'apt-get purge -y -q edgeinfer >/dev/null && ! pgrep -x edgeinferd && [ ! -e /usr/bin/edgeinferd ] && [ ! -e /var/lib/edgeinfer ]'
