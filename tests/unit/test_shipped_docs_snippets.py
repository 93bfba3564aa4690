"""The operator's guide's snippets (docs/operations/, its topics), run word for word (paths to this host's files and the model name substituted):
what an operator pastes must do what the guide says."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT

GUIDE = ROOT / "docs/operations"  # the guide's topics (docs/operations.md is their index)
BUNDLES = ROOT / "models/bundles"


def _block(after: str, lang: str) -> str:
    """The first ```lang block after the line containing `after`, its indentation removed."""
    text = "\n".join(p.read_text() for p in sorted(GUIDE.glob("*.md")))
    at = text.index(after)
    m = re.compile(r"^( *)```" + lang + r"\n(.*?)^\1```$", re.S | re.M).search(text, at)
    assert m, f"no ```{lang} block after {after!r}"
    return "\n".join(line[len(m.group(1)):] for line in m.group(2).splitlines()) + "\n"


@pytest.mark.skipif(not (BUNDLES / "detector").is_dir(), reason="the fetched model bundles (make models)")
def test_the_frigate_labelmap_is_the_detectors_beside_a_classifier(tmp_path):
    """Issue 35: the snippet read the host's first bundle (the classifier's labels) when a detector was served
    beside it. The snippet, given the detector's model name, writes the detector's labels."""
    snippet = _block("2. The labelmap: Frigate names a class id by its labelmap", "sh")
    config = tmp_path / "edgeinferd.yaml"
    config.write_text(yaml.safe_dump({
        "models": {"default": {"bundle": str(BUNDLES / "orientation")}, "det": {"bundle": str(BUNDLES / "detector")}},
        "streams": [{"name": "cam0", "model": "det", "producer": {"user": os.getuid()}}]}))
    out = tmp_path / "labels.txt"
    assert snippet.count("/etc/edgeinfer/edgeinferd.yaml") == 1 and " - default > " in snippet
    script = (snippet.replace("/opt/venvs/edgeinfer/bin/python", sys.executable)
              .replace("/etc/edgeinfer/edgeinferd.yaml", str(config))
              .replace(" - default > /srv/frigate/config/edgeinfer-labels.txt", f" - det > {out}"))
    r = subprocess.run(["sh", "-ec", script], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "daemon")})
    assert r.returncode == 0, r.stderr
    det = yaml.safe_load((BUNDLES / "detector/model.yaml").read_text())["labels"]
    cls = yaml.safe_load((BUNDLES / "orientation/model.yaml").read_text())["labels"]
    assert det != cls
    assert out.read_text().splitlines() == [f"{i} {name}" for i, name in enumerate(det)]
