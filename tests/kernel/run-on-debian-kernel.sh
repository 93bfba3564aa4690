#!/bin/bash
# The kernel facts ABI 2 rests on (docs/abi.md). Not part of `make test` (it downloads a
# kernel); the host half runs in tests/integration/test_kernel_facts.py.
#
# Build sealcheck, run it on this host, then boot Debian bookworm's stock 6.1
# kernel under qemu-system-x86_64 (TCG) with sealcheck as /init and print both
# outputs.  Must run as root (sealcheck drops a child to uid 65534; apt-get).
#
# Env overrides:
#   KPKG=linux-image-6.1.0-NN-amd64   kernel package (default: what bookworm's
#                                      linux-image-amd64 currently depends on)
#   QEMU_TIMEOUT=300                   bound on the qemu run (seconds)
#   SKIP_HOST=1 / SKIP_QEMU=1
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# Outside the clone: the kernel package is ~70 MB.
CACHE=${EDGEINFER_CACHE:-$HOME/.cache/edgeinfer}/kernel
BUILD=$CACHE/build
QEMU_TIMEOUT=${QEMU_TIMEOUT:-300}
mkdir -p "$CACHE" "$BUILD"

need() { command -v "$1" >/dev/null 2>&1; }
if ! need gcc || ! need cpio || ! need qemu-system-x86_64 || ! need dpkg-deb; then
	echo "### installing build-essential cpio qemu-system-x86" >&2
	apt-get update -q
	apt-get install -y -q gcc libc6-dev cpio qemu-system-x86
fi

echo "### building sealcheck (static)" >&2
gcc -O2 -Wall -static -o "$BUILD/sealcheck" "$HERE/sealcheck.c"

HOST_OUT=$CACHE/host.out
QEMU_LOG=$CACHE/qemu-6.1.log

if [ "${SKIP_HOST:-0}" != 1 ]; then
	echo "### running on host ($(uname -r))" >&2
	"$BUILD/sealcheck" >"$HOST_OUT" 2>&1 || echo "host run exit status $?" >>"$HOST_OUT"
fi

if [ "${SKIP_QEMU:-0}" != 1 ]; then
	if [ -z "${KPKG:-}" ]; then
		KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null |
			awk '/Depends: linux-image-6\.1\.0-[0-9]+-amd64/{print $2; exit}')
		if [ -z "$KPKG" ]; then
			apt-get update -q >&2
			KPKG=$(apt-cache depends linux-image-amd64 |
				awk '/Depends: linux-image-6\.1\.0-[0-9]+-amd64/{print $2; exit}')
		fi
	fi
	[ -n "$KPKG" ] || { echo "cannot determine kernel package" >&2; exit 1; }
	KVER=${KPKG#linux-image-}
	VMLINUZ=$CACHE/vmlinuz-$KVER
	if [ ! -s "$VMLINUZ" ]; then
		echo "### fetching $KPKG" >&2
		rm -rf "$CACHE/dl" "$CACHE/extract"
		mkdir -p "$CACHE/dl" "$CACHE/extract"
		chmod 777 "$CACHE/dl" # lets apt's _apt user write there (no "unsandboxed" warning)
		(cd "$CACHE/dl" && apt-get download "$KPKG")
		DEB=$(ls "$CACHE"/dl/"$KPKG"_*.deb | head -n1)
		cp "$DEB" "$CACHE/"
		dpkg-deb -x "$DEB" "$CACHE/extract"
		cp "$CACHE/extract/boot/vmlinuz-$KVER" "$VMLINUZ"
		rm -rf "$CACHE/dl" "$CACHE/extract"
	fi
	echo "### kernel: $VMLINUZ ($(ls "$CACHE"/"$KPKG"_*.deb 2>/dev/null | xargs -r -n1 basename))" >&2

	# initramfs: just /init (static sealcheck); it mounts devtmpfs/proc/tmpfs itself
	ROOT=$BUILD/initramfs
	rm -rf "$ROOT"
	mkdir -p "$ROOT"
	cp "$BUILD/sealcheck" "$ROOT/init"
	chmod 755 "$ROOT/init"
	(cd "$ROOT" && find . -mindepth 1 | cpio -o -H newc --owner 0:0 --quiet) >"$BUILD/initramfs.cpio"

	echo "### booting $KVER under qemu TCG (timeout ${QEMU_TIMEOUT}s)" >&2
	set +e
	timeout "$QEMU_TIMEOUT" qemu-system-x86_64 \
		-machine pc -accel tcg -cpu max -smp 2 -m 512M \
		-nographic -no-reboot \
		-kernel "$VMLINUZ" -initrd "$BUILD/initramfs.cpio" \
		-append 'console=ttyS0 panic=-1' </dev/null >"$QEMU_LOG" 2>&1
	rc=$?
	set -e
	echo "qemu exit status $rc" >>"$QEMU_LOG"
fi

extract() { tr -d '\r' <"$1" | sed -n '/=== SEALCHECK BEGIN ===/,/=== SEALCHECK END ===/p'; }

if [ -f "$HOST_OUT" ]; then
	echo "================ HOST ($(uname -r)) ================"
	cat "$HOST_OUT"
fi
if [ -f "$QEMU_LOG" ]; then
	echo "================ QEMU: Debian ${KPKG:-6.1} (full serial log: $QEMU_LOG) ================"
	if grep -q 'SEALCHECK BEGIN' "$QEMU_LOG"; then
		extract "$QEMU_LOG"
		grep -a -v -e '^\[' "$QEMU_LOG" | tr -d '\r' |
			sed -n '/=== SEALCHECK END ===/,$p' | sed 1d
	else
		echo "(no sealcheck output; tail of serial log follows)"
		tail -n 40 "$QEMU_LOG"
	fi
fi
