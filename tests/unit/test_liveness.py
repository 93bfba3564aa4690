"""support/liveness.Liveness, the gateway's and the MQTT bridge's watchdog evidence and /healthz lines, with
real threads. A stuck loop is made by dating its last turn back, not by waiting."""
from __future__ import annotations

import threading
import time

from edgeinfer.support.liveness import STUCK_AFTER_S, Liveness


def _thread(stop: threading.Event) -> threading.Thread:
    t = threading.Thread(target=stop.wait, args=(30,), daemon=True)
    t.start()
    return t


def test_a_turning_loop_with_its_threads_alive_is_ok():
    stop = threading.Event()
    t = _thread(stop)
    try:
        live = Liveness("the keeper")
        live.watch("frigate front stopped", t.is_alive)
        since = live.turned_at
        assert not live.watchdog_ok(since)          # no turn since the last ping
        while live.turned_at <= since:              # monotonic's resolution: bounded by the clock, not a sleep
            live.turned()
        assert live.watchdog_ok(since)
        assert live.problems() == []
    finally:
        stop.set()
        t.join(5)


def test_a_stopped_thread_fails_the_watchdog_and_names_itself():
    stop = threading.Event()
    t = _thread(stop)
    live = Liveness("the reader loop")
    live.watch("the MQTT client's thread stopped", t.is_alive)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    live.turned()
    assert not live.watchdog_ok(live.turned_at - 1.0)
    assert live.problems() == ["the MQTT client's thread stopped"]


def test_a_stuck_loop_is_named_first():
    live = Liveness("the keeper")
    live.watch("frigate front stopped", lambda: False)
    live.turned_at = time.monotonic() - STUCK_AFTER_S - 1.0
    assert live.problems() == ["the keeper is stuck", "frigate front stopped"]


def test_the_bridge_gives_it_the_publisher_thread_not_itself():
    """The bridge's Liveness holds a callable on its publisher, not the Bridge (collaborators get what they
    use); before the publisher starts, paho's thread is not alive and /healthz says so."""
    from edgeinfer.bridges.bridge import Bridge
    from edgeinfer.bridges.mqttconfig import MqttConfig
    b = Bridge(MqttConfig.model_validate({"streams": {"cam0": {}}}))
    assert b.live.loop == "the reader loop"
    assert not any(v is b for v in vars(b.live).values())
    assert b.live.problems() == ["the MQTT client's thread stopped"]
