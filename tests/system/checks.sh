# The container scripts' one way to report (sourced by inside.sh and upgrade.sh): one line per check in
# /out/results.txt, "PASS name detail" or "FAIL name detail", which the tests on the host assert.
R=/out/results.txt
: > $R
pass() { echo "PASS $1 ${2:-}" >> $R; }
fail() { echo "FAIL $1 ${2:-}" >> $R; }
# check NAME COMMAND...: PASS with the command's last line, or FAIL with its last three.
check() { local name=$1; shift; if out=$("$@" 2>&1); then pass "$name" "$(echo "$out" | tail -1)"; else fail "$name" "$(echo "$out" | tail -3 | tr '\n' ' ')"; fi; }
