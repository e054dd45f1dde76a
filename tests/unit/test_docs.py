"""The documentation: README.md is a short front door and docs/ holds the rest.

Fast and offline: the README's length, every relative link and anchor in README.md and docs/
(GitHub's heading slugs), every docs page reachable from the README's map, and the hosts of the
documented Vertex AI calls. A dedicated endpoint (what Terraform deploys: its outputs
``vertex_endpoint_dns``, ``vertex_predict_url``, ``vertex_raw_predict_url``,
``vertex_stream_raw_predict_url``, ``vertex_invoke_url`` and ``vertex_openai_base_url`` all
name ``{endpoint}.{region}-{number}.prediction.vertexai.goog``) refuses the shared
``REGION-aiplatform.googleapis.com`` host, so an example that calls it there cannot work.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def _root() -> Path:
    """The repository root, wherever under tests/ this file sits."""
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").is_file():
        here = here.parent
    return here


ROOT = _root()
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def split_fences(text: str) -> tuple[str, list[str]]:
    """(the text outside fenced code blocks, with each block replaced by an empty line;
    the code blocks themselves)."""
    prose: list[str] = []
    blocks: list[str] = []
    block: list[str] | None = None
    marker = ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if block is None:
            if m:
                block, marker = [], m.group(1)
                prose.append("")
            else:
                prose.append(line)
        elif m and m.group(1)[0] == marker[0] and len(m.group(1)) >= len(marker) \
                and not line.strip()[len(m.group(1)):].strip():
            blocks.append("\n".join(block))
            block = None
        else:
            block.append(line)
    if block is not None:
        blocks.append("\n".join(block))
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link labels kept, code marks dropped),
    lower case, punctuation other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)", r"\1", heading)
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    prose, _ = split_fences(text)
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose.splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    """The targets of the markdown links and images outside code (blocks and spans)."""
    prose, _ = split_fences(text)
    prose = INLINE_CODE.sub("", prose)
    return [m.group(2) for m in LINK.finditer(prose)]


def relative(target: str) -> bool:
    return bool(target) and not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)


def broken_links(page: Path) -> list[str]:
    out = []
    for target in links(page.read_text(encoding="utf-8")):
        if not relative(target) and not target.startswith("#"):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            out.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    return out


def test_slugs_follow_github():
    assert slug("Resumable streams across replicas (Redis)") == "resumable-streams-across-replicas-redis"
    assert slug("Security review: each finding and what became of it") == (
        "security-review-each-finding-and-what-became-of-it")
    assert slug("Embeddings (issue 13) (`bench/embeddings.py`)") == "embeddings-issue-13-benchembeddingspy"
    assert slug("`CPU_EXTRA_BUFFERS`") == "cpu_extra_buffers"
    assert slug("A [linked](x.md) heading") == "a-linked-heading"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n### A\n") == {"a", "a-1", "a-2"}
    assert links("[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n![d](e.png)") == ["x.md", "e.png"]


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines: keep it under {README_MAX_LINES}, move the rest to docs/")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    assert broken_links(page) == []


def test_every_docs_page_is_on_the_readme_map():
    linked = {(README.parent / t.partition("#")[0]).resolve()
              for t in links(README.read_text(encoding="utf-8")) if relative(t)}
    pages = set(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    missing = sorted(str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked)
    assert missing == [], "docs pages the README does not link to"


# ---- the hosts of documented Vertex AI calls ------------------------------------------------

# The shared regional host with an endpoint's path: a dedicated endpoint refuses it.
SHARED_HOST_CALL = re.compile(r"aiplatform\.googleapis\.com/v1\w*/projects/\S*?/endpoints/")
# Only an endpoint deployed with `vertex_dedicated_endpoint = false` answers there.
SHARED_ENDPOINT = re.compile(r"vertex_dedicated_endpoint\s*=\s*false")
# What reaches an endpoint's methods: predict, rawPredict, streamRawPredict, invoke.
VERTEX_METHOD = re.compile(r":(?:predict|rawPredict|streamRawPredict)\b|/invoke\b|output -raw vertex_")
# Where an honest call gets its host: Terraform's outputs, or the dedicated DNS itself.
DEDICATED = re.compile(r"output -raw vertex_\w+|\.prediction\.vertexai\.goog\b")
# gcloud's predict commands call the shared host (the deploy guide: they fail on a dedicated one).
GCLOUD_PREDICT = re.compile(r"\bgcloud\s+(?:beta\s+)?ai\s+endpoints\s+(?:predict|raw-predict|stream-raw-predict)\b")
ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
LOCAL = re.compile(r"\b(?:localhost|127\.0\.0\.1)\b")


def expand(line: str, env: dict[str, str]) -> str:
    """``line`` with the shell variables the same code block set written out."""
    for _ in range(8):
        new = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: env.get(m.group(1), m.group(0)), line)
        if new == line:
            break
        line = new
    return line


def dishonest_vertex_calls(text: str) -> list[str]:
    """The documented calls to a Vertex AI endpoint that do not use its own DNS name."""
    prose, blocks = split_fences(text)
    found = []
    for para in [*re.split(r"\n\s*\n", prose), *blocks]:
        if SHARED_ENDPOINT.search(para):
            continue  # about a shared endpoint: the regional host is right there
        found += [f"shared host: {m.group(0)}" for m in SHARED_HOST_CALL.finditer(para)]
    for block in blocks:
        env: dict[str, str] = {}
        for line in block.replace("\\\n", " ").splitlines():
            m = ASSIGN.match(line)
            if m:
                env[m.group(1)] = m.group(2)
            if GCLOUD_PREDICT.search(line):
                found.append(f"gcloud predicts on the shared host: {line.strip()}")
            if not re.search(r"\bcurl\b", line):
                continue
            call = expand(line, env)
            if LOCAL.search(call) or not VERTEX_METHOD.search(call):
                continue
            if not DEDICATED.search(call) or "aiplatform.googleapis.com" in call:
                found.append(f"not the endpoint's own DNS: {line.strip()}")
    return found


# README.md before the split (its "Resumable streams" section): the example this test exists for.
OLD_RESUME_EXAMPLE = """\
```bash
URL=https://$REGION-aiplatform.googleapis.com/v1/projects/$PROJECT/locations/$REGION/endpoints/$ENDPOINT
curl -N "$URL:streamRawPredict" -H "Authorization: Bearer $(gcloud auth print-access-token)" \\
  -H 'Content-Type: application/json' -H 'X-Conversation-Id: c1' \\
  -d '{"messages":[{"role":"user","content":"Tell a long story"}],"stream":true}'
curl "$URL:rawPredict" -H "Authorization: Bearer $(gcloud auth print-access-token)" \\
  -H 'Content-Type: application/json' -d '{"stream_cancel":{"conversation_id":"c1"}}'
```
"""


def test_the_host_rule_catches_the_shared_host():
    found = dishonest_vertex_calls(OLD_RESUME_EXAMPLE)
    assert any(f.startswith("shared host") for f in found), found
    assert sum(f.startswith("not the endpoint's own DNS") for f in found) == 2, found
    # the same calls without the URL line: the variable is unknown, so the host is not shown
    unknown = OLD_RESUME_EXAMPLE.replace(OLD_RESUME_EXAMPLE.splitlines()[1] + "\n", "")
    assert len(dishonest_vertex_calls(unknown)) == 2
    honest = OLD_RESUME_EXAMPLE.replace(
        "https://$REGION-aiplatform.googleapis.com/v1/projects/$PROJECT/locations/$REGION/endpoints/$ENDPOINT",
        "https://$(terraform -chdir=terraform output -raw vertex_endpoint_dns)"
        "/v1/projects/$PROJECT/locations/$REGION/endpoints/$ENDPOINT")
    assert dishonest_vertex_calls(honest) == []
    assert dishonest_vertex_calls("```bash\ngcloud ai endpoints predict 123 --json-request=r.json\n```") != []
    # prose may name the shared host (to say it is refused), and local calls are not Vertex's
    assert dishonest_vertex_calls("a dedicated endpoint refuses `REGION-aiplatform.googleapis.com`\n"
                                  "```bash\ncurl -s localhost:8080/predict -d @r.json\n```") == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_vertex_calls_use_the_endpoints_own_dns(page):
    assert dishonest_vertex_calls(page.read_text(encoding="utf-8")) == []
