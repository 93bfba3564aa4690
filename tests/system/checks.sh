# The container scripts' one way to report (sourced by inside.sh and upgrade.sh): one line per check in
# /out/results.txt, "PASS name detail", "FAIL name detail" or "SKIP name why" (a command that exits 77: this host
# lacks what it needs), which the tests on the host assert.
R=/out/results.txt
: > $R
pass() { echo "PASS $1 ${2:-}" >> $R; }
fail() { echo "FAIL $1 ${2:-}" >> $R; }
# check NAME COMMAND...: PASS with the command's last line, or FAIL with its last three.
check() {
    local name=$1 rc=0; shift
    out=$("$@" 2>&1) || rc=$?
    if [ $rc = 0 ]; then pass "$name" "$(echo "$out" | tail -1)"
    elif [ $rc = 77 ]; then echo "SKIP $name $(echo "$out" | tail -1)" >> $R
    else fail "$name" "$(echo "$out" | tail -3 | tr '\n' ' ')"; fi
}
