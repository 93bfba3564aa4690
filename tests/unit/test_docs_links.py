"""The docs' links hold: every relative link in docs/ and README.md lands on a file that exists and, for a
Markdown file, on an anchor it has (GitHub's heading slugs, or an <a id>); and every anchor of the operator's
guide from before it was split by topic (docs/operations/) still resolves in docs/operations.md, whose line for
it links to where the section went, so links and bookmarks made before the split keep working."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")

# The anchors of docs/operations.md (its headings, GitHub's slugs) before the split, taken from that file.
OLD_ANCHORS = [
    'install-debian-12',
    'who-may-produce-and-read-a-stream',
    'restarts-the-fd-store-and-socket-activation',
    'upgrading',
    'removing-and-purging',
    'the-gateways-unit-user-and-files',
    'the-mqtt-bridges-unit-user-and-files',
    'running-it-in-the-foreground',
    'cameras-as-services',
    'the-ffmpeg-feed',
    'configuration',
    'several-models-and-lanes',
    'model-bundles',
    'keys-and-trust',
    'what-is-refused-and-the-message',
    'size-limits',
    'anti-rollback',
    'updating-a-model-hot-reload',
    'a-refused-bundle-and-the-next-restart-the-last-known-good-bundle',
    'rollouts-shadow-and-canary-decided-on-the-host',
    'int8-quantization-model-quantize-and-the-per-host-bench-model-bench',
    'fronts-network-clients-edgeinfer-gateway',
    'the-grpc-front-open-inference-protocol-v2',
    'the-frigate-front-frigates-zmq-detector',
    'bridges-results-off-the-host-edgeinfer-mqtt',
    'its-file-etcedgeinfermqttyaml',
    'topics',
    'the-result-message',
    'events-from-rules',
    'tls-and-the-password',
    'who-may-write-the-bridges-topics',
    'when-the-broker-is-slow-or-gone',
    'latency-to-subscribers',
    'its-metrics',
    'the-decision-log',
    'metrics-health-dashboards-alerts',
    'drift',
    'tuning',
    'keeping-the-lanes-cpus-to-themselves',
    'drops',
    'failure-behaviour-what-the-reliability-campaign-checks',
]


def _slug(text: str) -> str:
    s = re.sub(r"<[^>]+>", "", text.strip().lower())
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    return re.sub(r"[^\w\- ]", "", s).replace(" ", "-")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    seen, out = {}, set()
    for line in _prose(text):
        if m := HEADING.match(line):
            s = _slug(m[2])
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out | set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))


def _links(path: Path):
    for line in _prose(path.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # a URL, mailto:
                yield target


def _markdown_files():
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_every_relative_link_lands_on_a_file_and_an_anchor():
    broken = []
    for md in _markdown_files():
        for target in _links(md):
            name, _, anchor = target.partition("#")
            dest = (md.parent / name).resolve() if name else md
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(ROOT)}: {target}: {dest.name} has no such anchor")
    assert not broken, "\n".join(broken)


def test_every_old_anchor_of_the_guide_still_resolves_and_says_where_it_went():
    index = DOCS / "operations.md"
    have = anchors(index)
    lines = index.read_text().splitlines()
    for old in OLD_ANCHORS:
        assert old in have, f"docs/operations.md#{old} no longer resolves"
        line = next((l for l in lines if f'<a id="{old}">' in l), None)
        if line is None:
            continue  # a heading the index kept itself
        targets = [t for t in LINK.findall(line) if t.startswith("operations/")]
        assert targets, f"docs/operations.md#{old}: its line links to no topic"
        name, _, anchor = targets[0].partition("#")
        assert (DOCS / name).is_file() and anchor in anchors(DOCS / name), f"#{old} points to {targets[0]}"


def test_the_guide_is_an_index_of_topics():
    topics = sorted(p.name for p in (DOCS / "operations").glob("*.md"))
    index = (DOCS / "operations.md").read_text()
    assert len(topics) >= 8
    for name in topics:
        assert f"](operations/{name})" in index, f"docs/operations.md does not list {name}"
