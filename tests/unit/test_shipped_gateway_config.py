"""The shipped etc/edgeinfer/gateway.yaml is the gateway configuration's documentation: held here to the schema
(daemon/edgeinfer/fronts/gatewayconfig.py GatewayConfig), walked recursively with test_shipped_config.py's helpers, so
that a key added to the schema fails these tests until the file documents it.

The file's convention is edgeinferd.yaml's (stated at its top): every key appears; a key that is set shows its
default; a commented-out key has no default and shows an example. The exception: `models`, whose default (every
model with a pool of the gateway's user, served as is) is no entry to show, so its entry is a commented-out example.
"""
from __future__ import annotations

import yaml

from conftest import ROOT
from edgeinfer.fronts.gatewayconfig import GATEWAY_CONFIG, GatewayConfig, load_gateway_config
from test_shipped_config import commented_with_a_default, not_defaults, schema_fields, shown_keys, uncommented

SHIPPED = ROOT / "etc/edgeinfer/gateway.yaml"
EXAMPLES = {("models",), ("grpc", "sockets")}  # defaults that are no entry to show: an example instead


def test_the_walk_sees_the_gateway_keys():
    keys = schema_fields(GatewayConfig)
    for k in [("daemon_config",), ("models", "sizes"), ("models", "max_waiting"), ("grpc", "tls", "client_ca"),
              ("grpc", "workers"), ("frigate", "socket_group"), ("metrics", "listen")]:
        assert k in keys
    assert EXAMPLES <= set(keys)


def test_shipped_gateway_config_has_every_key_of_the_schema_and_no_other():
    unknown, present = shown_keys(SHIPPED, schema_fields(GatewayConfig))
    assert unknown == [], f"{SHIPPED} shows keys the schema does not have (commented-out or not): {unknown}"
    missing = sorted(".".join(k) for k in set(schema_fields(GatewayConfig)) - present)
    assert missing == [], f"{SHIPPED} does not document {missing}"


def test_gateway_commented_out_keys_are_the_ones_without_a_default():
    wrong, commented = commented_with_a_default(SHIPPED, schema_fields(GatewayConfig), EXAMPLES)
    assert ("grpc", "tls") in commented and ("models",) in commented
    assert wrong == [], f"commented out in {SHIPPED}, but they have a default to show: {wrong}"


def test_shipped_gateway_config_is_valid_and_shows_the_defaults():
    """It loads, every value it sets is the default, and it is the file the unit's ExecStart names."""
    cfg = load_gateway_config(str(SHIPPED))
    assert (wrong := not_defaults(cfg, examples=EXAMPLES)) == [], f"{SHIPPED} sets values other than the defaults: {wrong}"
    assert cfg.models == {} and not cfg.frigate.enabled and cfg.grpc.loopback()
    unit = (ROOT / "systemd/edgeinfer-gateway.service").read_text()
    assert f"ExecStart=/usr/bin/edgeinferctl gateway --config {GATEWAY_CONFIG}\n" in unit
    assert f"etc/edgeinfer/{SHIPPED.name} etc/edgeinfer/" in (ROOT / "packaging/debian/edgeinfer.install").read_text()
    # The Frigate socket's default path lies in the unit's RuntimeDirectory=.
    assert cfg.frigate.endpoint.startswith("ipc:///run/edgeinfer-gateway/") and \
        "\nRuntimeDirectory=edgeinfer-gateway\n" in unit


def test_the_example_model_entry_is_valid():
    """The commented-out `models:` entry, uncommented, loads too (its values are examples an operator copies)."""
    data = yaml.safe_load(uncommented(SHIPPED.read_text()))
    cfg = GatewayConfig.model_validate(data)
    (name, front), = cfg.models.items()
    assert front.size_list() == [(640, 480), (1280, 720)] and cfg.grpc.tls is not None


def test_a_socket_mode_is_octal_and_gives_others_nothing_each_naming_its_key():
    """grpc.sockets[].mode and frigate.socket_mode share one check (settings._socket_mode); its message names
    the key it was given."""
    import pydantic
    import pytest
    cases = [({"grpc": {"sockets": [{"path": "/run/x.sock", "mode": "0667"}]}}, "mode is octal"),
             ({"grpc": {"sockets": [{"path": "/run/x.sock", "mode": "rw"}]}}, "mode is octal"),
             ({"frigate": {"socket_mode": "777"}}, "socket_mode is octal")]
    for doc, said in cases:
        with pytest.raises(pydantic.ValidationError, match=said + r', e.g. "0660", and gives others nothing'):
            GatewayConfig.model_validate(doc)
    ok = GatewayConfig.model_validate({"grpc": {"sockets": [{"path": "/run/x.sock", "mode": "640"}]},
                                       "frigate": {"socket_mode": "0660"}})
    assert ok.grpc.sockets[0].mode == "640" and ok.frigate.socket_mode == "0660"
