"""The model registry (control/registry.py) and the reload (control/reload.py), without root or a real lane.

The bundle loader (ModelRegistry.load: signature, limits, anti-rollback, the ONNX graph) is replaced by a fake that
hands back model records, and the lanes by a stand-in that stages or refuses as told: what is checked here is the
bookkeeping around them (what serves, what is counted, what is written to the anti-rollback state, what the
lanes are asked). tests/integration reloads real signed bundles in a real daemon."""
from __future__ import annotations

import json
import types

import pytest

from edgeinfer.config.schema import load_config
from edgeinfer.control import registry
from edgeinfer.control.reload import Reloader
from edgeinfer.models.bundle import BundleError
from edgeinfer.models.providers import CPU_SPEC
from edgeinfer.models.rollback import STATE_FILE

NAME = "default"  # config.sections.LEGACY_MODEL_NAME: the model of `model.bundle`


def fake_model(version: str, sha: str, capacity: int = 100):
    return types.SimpleNamespace(
        name="det", version=version, target=f"/bundles/{version}", provider=CPU_SPEC,
        bundle=types.SimpleNamespace(sha256=sha, meta={"version": version}, path=f"/bundles/{version}"),
        meta=types.SimpleNamespace(floor_family="det"), decoder=types.SimpleNamespace(payload_capacity=capacity))


class Lanes:
    def __init__(self):
        self.staged, self.committed, self.refuse = [], [], {}

    def geometries_attached(self, name):
        return [("bgr24", 8, 16)]

    def stage(self, name, model, geometries, on_its_provider=False):
        self.staged.append((name, model.version, list(geometries)))
        return dict(self.refuse)

    def commit(self, name, model):
        self.committed.append((name, model.version))


class Notifier:
    def __init__(self):
        self.sent = []

    def send(self, *lines):
        self.sent.append(lines)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text(f"""\
model:
  bundle: /tmp/bundle
  state_dir: {tmp_path}
streams:
  - name: cam0
    producer: {{user: 0}}
    max_age_ms: 100
""")
    cfg = load_config(str(tmp_path / "c.yaml"))
    loads = {"next": fake_model("1.0", "a" * 64)}
    monkeypatch.setattr(registry.ModelRegistry, "load", lambda self, name, path=None, provider=None: loads["next"])
    models = registry.ModelRegistry(cfg)
    models.start(NAME)
    lanes, notifier = Lanes(), Notifier()
    stream = types.SimpleNamespace(name="cam0", model=NAME, writer=types.SimpleNamespace(payload_capacity=100))
    rollouts = types.SimpleNamespace(under_way=lambda name: None)
    reloader = Reloader(cfg, None, models=models, lanes=lanes, streams=[stream], notifier=notifier,
                        trim=types.SimpleNamespace(schedule=lambda: None), status_line=lambda: "serving",
                        rollouts=rollouts)
    return types.SimpleNamespace(cfg=cfg, models=models, lanes=lanes, notifier=notifier, reloader=reloader,
                                 loads=loads, state=tmp_path / STATE_FILE)


def _floor(setup):
    return json.loads(setup.state.read_text())["det"]["highest"] if setup.state.exists() else None


def test_the_start_serves_the_model_and_raises_its_floor(setup):
    served = setup.models.served[NAME]
    assert (served.version, served.target, served.last_error) == ("1.0", "/bundles/1.0", None)
    assert _floor(setup) == "1.0"


def test_a_reload_of_an_unchanged_bundle_asks_the_lanes_nothing(setup):
    setup.loads["next"] = fake_model("1.0", "a" * 64)
    assert setup.reloader.reload() == {NAME: True}
    assert setup.lanes.staged == [] and setup.lanes.committed == []
    assert setup.models.reloads == 0
    assert setup.notifier.sent[0][0] == "RELOADING=1" and setup.notifier.sent[-1] == ("READY=1", "STATUS=serving")


def test_a_new_version_is_staged_in_the_lanes_then_swapped_and_recorded(setup):
    setup.loads["next"] = fake_model("2.0", "b" * 64)
    assert setup.reloader.reload() == {NAME: True}
    assert setup.lanes.staged == [(NAME, "2.0", [("bgr24", 8, 16)])]
    assert setup.lanes.committed == [(NAME, "2.0")]
    assert (setup.models.served[NAME].version, setup.models.reloads) == ("2.0", 1)
    assert _floor(setup) == "2.0"


def test_a_version_a_lane_refuses_leaves_the_old_one_serving_and_is_counted(setup):
    setup.loads["next"] = fake_model("2.0", "b" * 64)
    setup.lanes.refuse = {"lane0": "out of memory"}
    assert setup.reloader.reload() == {NAME: False}
    assert setup.lanes.committed == []
    served = setup.models.served[NAME]
    assert served.version == "1.0" and served.last_error == "lane0: out of memory"
    assert setup.models.reload_failures == {"signature": 0, "rollback": 0, "load": 1}
    assert setup.models.last_reload_error == f"{NAME}: lane0: out of memory"
    assert _floor(setup) == "1.0"


def test_results_larger_than_the_result_rings_are_refused_before_any_lane_is_asked(setup):
    setup.loads["next"] = fake_model("2.0", "b" * 64, capacity=101)
    assert setup.reloader.reload() == {NAME: False}
    assert setup.lanes.staged == []
    assert "more than the result rings of cam0 hold (100)" in setup.models.served[NAME].last_error


def test_a_bundle_the_loader_refuses_is_counted_by_its_reason(setup, monkeypatch):
    def refuse(self, name, path=None, provider=None):
        raise BundleError("/bundles/3.0: model.onnx: not a model")
    monkeypatch.setattr(registry.ModelRegistry, "load", refuse)
    assert setup.reloader.reload() == {NAME: False}
    assert setup.models.served[NAME].failures["load"] == 1
    assert setup.models.served[NAME].version == "1.0"
