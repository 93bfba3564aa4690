"""The shipped etc/edgeinfer/mqtt.yaml is the MQTT bridge configuration's documentation: held here to the schema
(daemon/edgeinfer/bridges/mqttconfig.py MqttConfig), walked recursively with test_shipped_config.py's helpers, so that
a key added to the schema fails these tests until the file documents it.

The file's convention is edgeinferd.yaml's (stated at its top): every key appears; a key that is set shows its
default; a commented-out key has no default and shows an example. The exceptions: `streams`, required, whose one
entry (cam0, the shipped edgeinferd.yaml's example stream) shows each stream's defaults; a stream's `rules`, whose
default (none) is no entry to show, so its entries are commented-out examples; and `node`, whose default is the
host's name (commented out, with an example).
"""
from __future__ import annotations

import contextlib
import io

import pytest
import yaml

from conftest import ROOT
from edgeinfer.bridges.mqttconfig import MQTT_CONFIG, MqttConfig, StreamOut, load_mqtt_config
from edgeinfer.cli.ctl import edgeinferctl_main
from test_shipped_config import commented_with_a_default, not_defaults, schema_fields, shown_keys, uncommented

SHIPPED = ROOT / "etc/edgeinfer/mqtt.yaml"
EXAMPLES = {("streams",), ("streams", "rules"), ("node",)}


def test_the_walk_sees_the_bridge_keys():
    keys = schema_fields(MqttConfig)
    for k in [("daemon_config",), ("broker", "tls", "ca"), ("broker", "password_file"), ("streams", "max_rate_hz"),
              ("streams", "rules", "end_after_ms"), ("streams", "rules", "region"), ("qos", "state"),
              ("metrics", "listen"), ("decisions", "fsync_interval_ms")]:
        assert k in keys
    assert EXAMPLES <= set(keys)


def test_shipped_mqtt_config_has_every_key_of_the_schema_and_no_other():
    unknown, present = shown_keys(SHIPPED, schema_fields(MqttConfig))
    assert unknown == [], f"{SHIPPED} shows keys the schema does not have (commented-out or not): {unknown}"
    missing = sorted(".".join(k) for k in set(schema_fields(MqttConfig)) - present)
    assert missing == [], f"{SHIPPED} does not document {missing}"


def test_mqtt_commented_out_keys_are_the_ones_without_a_default():
    wrong, commented = commented_with_a_default(SHIPPED, schema_fields(MqttConfig), EXAMPLES)
    assert {("broker", "tls"), ("broker", "password_file"), ("streams", "rules"), ("node",)} <= commented
    assert wrong == [], f"commented out in {SHIPPED}, but they have a default to show: {wrong}"


def test_shipped_mqtt_config_is_valid_and_shows_the_defaults():
    """It loads, every value it sets is the default, and it is the file the unit's ExecStart names."""
    cfg = load_mqtt_config(str(SHIPPED))
    assert (wrong := not_defaults(cfg, examples=EXAMPLES)) == [], f"{SHIPPED} sets values other than the defaults: {wrong}"
    # The one example stream shows a stream's defaults, and no rule.
    assert list(cfg.streams) == ["cam0"] and cfg.streams["cam0"] == StreamOut()
    assert cfg.broker.tls is None and cfg.broker.username is None and cfg.broker.password_file is None
    unit = (ROOT / "systemd/edgeinfer-mqtt.service").read_text()
    assert f"ExecStart=/usr/bin/edgeinferctl mqtt --config {MQTT_CONFIG}\n" in unit
    assert f"etc/edgeinfer/{SHIPPED.name} etc/edgeinfer/" in (ROOT / "packaging/debian/edgeinfer.install").read_text()
    # The decision log's default path lies in the unit's StateDirectory=, the one place it may write, and is
    # the path `edgeinferctl decisions` reads by default.
    assert cfg.decisions.path.startswith("/var/lib/edgeinfer-mqtt/") and "\nStateDirectory=edgeinfer-mqtt\n" in unit
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        edgeinferctl_main(["decisions", "--help"])
    assert f"default {cfg.decisions.path})" in " ".join(help_text.getvalue().split())


def test_the_example_rules_are_valid():
    """The commented-out rules, uncommented, load too (their values are examples an operator copies), one rule
    ending by time and one by frames."""
    data = yaml.safe_load(uncommented(SHIPPED.read_text()))
    cfg = MqttConfig.model_validate(data)
    rules = cfg.streams["cam0"].rules
    assert set(rules) == {"person_at_gate", "tilted"}
    assert rules["person_at_gate"].end_after_ms == 2000 and rules["person_at_gate"].region == (0, 200, 640, 480)
    assert rules["tilted"].end_after_frames == 30 and rules["tilted"].labels == ["90", "180", "270"]
    assert cfg.broker.tls is not None and cfg.broker.tls.key is not None and cfg.node == "cell-3"
