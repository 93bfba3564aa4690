"""The shipped edgeinferd.yaml and gateway.yaml, loaded together, never refuse each other (issue 35: every gateway
start and daemon restart logged max_pending_per_user refusals, because the shipped pool of 4 streams connects all
at once and the shipped per-user cap of handshakes was 2). The daemon's example pool, uncommented as an operator
does, serves the gateway's user (its unit's User=), and every cap the daemon puts on one party fits the rings the
gateway opens at once: one frame ring (ingress socket) and one result ring (results socket) per pool stream.

The caps are the daemon's own (Admission.pending_cap, the ingress's rule); the users edgeinfer and edgeinfer-gw,
which the package creates, are shown to the loader where this host has none (as test_shipped_config does)."""
from __future__ import annotations

import re
import types

import pytest

from conftest import ROOT
from edgeinfer.config.identity import user_id
from edgeinfer.config.schema import load_config
from edgeinfer.control.admission import Admission
from edgeinfer.fronts.gatewayconfig import load_gateway_config
from test_shipped_config import COMMENTED_KEY, edgeinfer_group, stand_in_user  # noqa: F401 (a fixture)

DAEMON = ROOT / "etc/edgeinfer/edgeinferd.yaml"
GATEWAY = ROOT / "etc/edgeinfer/gateway.yaml"
UNIT = ROOT / "systemd/edgeinfer-gateway.service"


@pytest.fixture
def gateway_user(monkeypatch, edgeinfer_group):  # noqa: F811
    stand_in_user(monkeypatch, "edgeinfer-gw", 64998, "/nonexistent")


def _with_the_example_pool(text: str) -> str:
    """The daemon's file with its commented-out `pools:` example put back (what an operator uncomments)."""
    head, sep, rest = text.partition("\n# pools:\n")
    assert sep, "the shipped edgeinferd.yaml has no commented-out pools: example"
    block, blank, tail = rest.partition("\n\n")
    return head + "\n" + COMMENTED_KEY.sub(r"\1\2", "# pools:\n" + block) + blank + tail


def test_the_shipped_pool_fits_the_shipped_caps(tmp_path, gateway_user):
    gw = load_gateway_config(str(GATEWAY))
    assert gw.daemon_config == "/etc/edgeinfer/edgeinferd.yaml"  # the file below, where the package puts it
    path = tmp_path / "edgeinferd.yaml"
    path.write_text(_with_the_example_pool(DAEMON.read_text()))
    cfg = load_config(str(path))
    user = re.search(r"^User=(\S+)$", UNIT.read_text(), re.M).group(1)
    uid = user_id(user)
    ours = {name: p for name, p in (cfg.pools or {}).items() if user_id(p.user) == uid}
    assert ours, f"the example pool is not the gateway's user's ({user})"
    rings = sum(p.streams for p in ours.values())  # the gateway connects every stream of them at start
    assert rings == 4, rings  # the shipped example (the figure of the issue)

    adm = Admission(cfg, [types.SimpleNamespace(name=s.name) for s in cfg.all_streams()], None, None)
    ing = cfg.ingress
    for kind in ("ingress", "results"):
        assert adm.pending_cap(kind, adm.party(types.SimpleNamespace(uid=uid))) >= rings, kind
    assert rings <= ing.max_pending  # the socket's pool of handshakes holds them all too
    assert rings <= ing.max_readers_per_user and rings <= ing.max_readers  # one reader connection per stream
    # The gateway's deadlines fit the pool's max_age (else it refuses to start: fronts/plan.py).
    assert all(gw.grpc.max_deadline_ms <= p.max_age_ms for p in ours.values())
    # A camera's user keeps the shipped cap: only the pool's user, named for more streams, gets more.
    cam = user_id(cfg.streams[0].producer.user)
    if cam != uid:
        assert adm.pending_cap("ingress", cam) == ing.max_pending_per_user
