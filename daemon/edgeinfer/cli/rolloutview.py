"""`edgeinferctl model rollout NAME [promote|abort]`: a model's rollout against its gates, read from the daemon's
/metrics (edgeinfer_rollout_*), and the operator's early decision, handed to the daemon as a request file in its
state directory (control/rollout.py takes it within a second, and only for the candidate it names)."""
from __future__ import annotations

import getpass
import os
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


FIGURES = {"edgeinfer_rollout_compared_frames": "frames", "edgeinfer_rollout_agreement": "agreement",
           "edgeinfer_rollout_p99_ratio": "p99_ratio", "edgeinfer_rollout_time_ratio": "time_ratio",
           "edgeinfer_rollout_agreement_low": "agreement_low", "edgeinfer_rollout_time_ratio_high": "time_ratio_high",
           "edgeinfer_rollout_error_rate": "error_rate",
           "edgeinfer_rollout_elapsed_seconds": "elapsed_s"}


def empty() -> dict:
    return {"active": None, "gates": {}, "decisions": [], "served": None}


def absorb(r: dict, s) -> None:
    """One sample of /metrics into a model's rollout `r` (empty()); samples of other families are ignored."""
    if s.name == "edgeinfer_rollout_active":
        r["active"] = {**(r["active"] or {}), "serving": s.labels["serving"], "candidate": s.labels["candidate"],
                       "policy": s.labels["policy"]}
    elif s.name in FIGURES:
        r["active"] = {**(r["active"] or {}), FIGURES[s.name]: s.value}
    elif s.name == "edgeinfer_rollout_gate":
        r["gates"][s.labels["gate"]] = s.value
    elif s.name == "edgeinfer_rollout_decisions_total":
        r["decisions"].append((s.labels["serving"], s.labels["candidate"], s.labels["decision"], int(s.value)))
    elif s.name == "edgeinfer_model_info":
        r["served"] = f"{s.labels['name']} {s.labels['version']}"


def read(url: str, model: str, timeout: float = 3.0, endpoint=None) -> dict:
    """The model's rollout from one scrape: {active: {...} or None, gates: {...}, decisions: [...], served}.
    endpoint (statusview.Endpoint): where the URL came from, said with the options that choose another when the
    scrape fails (a refused connection, or a daemon too busy to answer within `timeout`)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except OSError as e:  # URLError, a refused or timed-out connection
        why = getattr(e, "reason", None) or e.strerror or e
        from_config = endpoint is not None and endpoint.from_config
        where = f"metrics.listen of {endpoint.config}" if from_config else "--url"
        other = "--url URL (or --config FILE)" if from_config else "another --url"
        raise OSError(f"cannot read edgeinferd's metrics at {url} (from {where}): {why} (waited {timeout:g} s); is "
                      f"edgeinferd running, or too busy to answer? {other} reads another") from None
    out = empty()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("model") == model:
                absorb(out, s)
    return out


def summary(model: str, r: dict) -> str | None:
    """One line of a rollout under way (edgeinferctl status), or None."""
    a = r["active"]
    if not a or "candidate" not in a:
        return None

    def f(key, spec):
        return "-" if a.get(key) is None else format(a[key], spec)
    return (f"rollout {model}: {a['policy']} {a['candidate']} beside {a['serving']}, {f('frames', '.0f')} frames "
            f"compared, agreement {f('agreement', '.4f')}, run-time ratio {f('time_ratio', '.2f')}, error rate "
            f"{f('error_rate', '.4f')} (edgeinferctl model rollout {model})")


def render(model: str, r: dict) -> str:
    lines = []
    a, g = r["active"], r["gates"]
    if a and "candidate" in a:
        lines.append(f"model {model}: {a['policy']} rollout of {a['candidate']} beside the serving {a['serving']}, "
                     f"{a.get('elapsed_s', 0):.0f} s")
        lines.append(f"  {'gate':<12} {'now':>10}  {'needs':<10} state")

        def row(name, now, op, need, fmt, bound=None):
            """bound: the figure's confidence bound that must pass the gate (agreement's lower, the run-time
            ratio's upper): the figure alone passing is not yet enough."""
            if need is None:
                return
            if now is None:
                lines.append(f"  {name:<12} {'-':>10}  {op} {format(need, fmt):<7} not measured yet")
                return
            ok = now >= need if op == ">=" else now <= need
            sure = bound is None or (bound >= need if op == ">=" else bound <= need)
            state = ("passing" if sure else f"undecided (bound {format(bound, fmt)})") if ok else \
                "FAILING" if name not in ("frames", "seconds") else "waiting"
            lines.append(f"  {name:<12} {format(now, fmt):>10}  {op} {format(need, fmt):<7} {state}")
        row("frames", a.get("frames"), ">=", g.get("min_frames"), ".0f")
        row("seconds", a.get("elapsed_s"), ">=", g.get("min_seconds"), ".0f")
        row("agreement", a.get("agreement"), ">=", g.get("min_agreement"), ".4f", a.get("agreement_low"))
        row("time ratio", a.get("time_ratio"), "<=", g.get("max_time_ratio"), ".2f", a.get("time_ratio_high"))
        row("error rate", a.get("error_rate"), "<=", g.get("max_error_rate"), ".4f")
    else:
        lines.append(f"model {model}: no rollout under way (serving {r['served'] or 'nothing'})")
    for serving, candidate, decision, n in r["decisions"]:
        lines.append(f"  decided: {candidate} beside {serving}: "
                     f"{'promoted' if decision == 'promote' else 'rolled back'}" + (f" ({n} times)" if n > 1 else ""))
    return "\n".join(lines)


def state_dir_of(config: str) -> str:
    """The daemon's model.state_dir from its configuration (where a request is left for it). Raises ConfigError,
    OSError or ValueError saying why it cannot be read."""
    from pydantic import BaseModel, ConfigDict
    from edgeinfer.config.sections import ModelConfig
    from edgeinfer.support.yamlconf import load_yaml_file

    class ModelOnly(BaseModel):  # the one section a request needs
        model_config = ConfigDict(extra="ignore")
        model: ModelConfig = ModelConfig()
    return load_yaml_file(ModelOnly, config).model.state_dir


def request(url: str, model: str, action: str, state_dir: str, wait_s: float, endpoint=None) -> tuple[int, str]:
    """Asks the daemon to promote or abort the candidate under way now (named by its version, so a request never
    applies to a later one); waits up to wait_s for the daemon to take it. (exit code, what to print)."""
    from edgeinfer.control.rollout import REQUEST_FILE  # the daemon's name for it (imported here: it pulls in ORT)
    from edgeinfer.support.statefile import write_json
    before = read(url, model, endpoint=endpoint)
    if not os.path.isdir(state_dir):  # never made here: the daemon makes it, and would never look elsewhere
        return 1, (f"edgeinferctl: {state_dir} is not a directory: it is not the daemon's model.state_dir (give "
                   "--state-dir DIR, or --config the daemon's configuration)")
    a = before["active"]
    if not a or "candidate" not in a:
        return 1, render(model, before) + f"\nnothing to {action}"
    path = os.path.join(state_dir, REQUEST_FILE.format(model=model))
    try:
        who = f"{getpass.getuser()} (uid {os.getuid()})"
    except (KeyError, OSError):
        who = f"uid {os.getuid()}"
    write_json(path, {"action": action, "candidate": a["candidate"], "by": who})
    deadline = time.monotonic() + wait_s
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.path.exists(path):
        return 1, (f"edgeinferd has not taken {path} within {wait_s:g} s (is it running, with model.state_dir "
                   f"{state_dir}?); the request stays there until it does, or until you remove it")
    time.sleep(0.5)  # the decision is in the next scrape
    return 0, render(model, read(url, model, endpoint=endpoint))
