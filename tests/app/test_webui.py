"""The playground page (WEBUI): served at / with its files, a strict CSP, no key needed to load
it; off leaves / a 404. The page's Markdown renderer and SSE reader run in Chromium here too
(the files are routed to the browser, no server); tests/e2e/test_webui.py drives the whole page
against the real server and model."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from app.api import webui
from tests.support.app import make_client
from tests.support.server import ROOT

WEBUI = ROOT / "app" / "webui"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def page_client(fake_engine):
    return make_client(fake_engine)


def test_the_page_and_every_file_are_served_with_their_types(page_client):
    resp = page_client.get("/")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'<script type="module" src="/webui/app.js">' in resp.data
    for name, ctype in webui.FILES.items():
        if name == "index.html":
            continue
        r = page_client.get(webui.PREFIX + name)
        assert r.status_code == 200, name
        assert r.headers["Content-Type"] == ctype
        assert r.data == (WEBUI / name).read_bytes()


def test_every_file_in_the_folder_is_listed_and_shipped():
    on_disk = {p.name for p in WEBUI.iterdir() if p.is_file()}
    assert on_disk == set(webui.FILES)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "webui/*" in pyproject["tool"]["setuptools"]["package-data"]["app"]


def test_what_the_page_links_and_imports_exists(page_client):
    html = (WEBUI / "index.html").read_text()
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked and all(u.startswith(webui.PREFIX) for u in linked)
    for url in linked:
        assert page_client.get(url).status_code == 200, url
    for js in WEBUI.glob("*.js"):
        for mod in re.findall(r'from "\./([^"]+)"', js.read_text()):
            assert mod in webui.FILES, (js.name, mod)


def test_strict_csp_and_no_inline_code(page_client):
    for path in ["/", "/webui/app.js", "/webui/style.css"]:
        h = page_client.get(path).headers
        csp = h["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe" not in csp
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert "connect-src 'self'" in csp and "style-src 'self'" in csp
        assert h["X-Content-Type-Options"] == "nosniff"
        assert h["Cache-Control"] == "no-cache"
    html = (WEBUI / "index.html").read_text()
    # every script has a src; no event handler attributes, style attributes or <style>
    assert len(re.findall(r"<script\b", html)) == len(re.findall(r"<script\b[^>]*\bsrc=", html)) == 1
    assert not re.search(r"\son[a-z]+\s*=", html)
    assert not re.search(r"\sstyle\s*=", html) and "<style" not in html


def test_nothing_is_loaded_from_another_origin():
    html = (WEBUI / "index.html").read_text()
    assert "://" not in html
    css = (WEBUI / "style.css").read_text()
    assert "@import" not in css and "url(" not in css
    calls = []
    for js in WEBUI.glob("*.js"):
        # every request the page makes goes through fetch() or api() with a path on this server
        calls += re.findall(r"\b(?:fetch|api)\(\s*([^,)]+)", js.read_text())
    assert len(calls) >= 8
    for target in calls:
        target = target.strip()
        assert target == "path" or re.match(r"[\"`]/", target), target


def test_etag_revalidation(page_client):
    first = page_client.get("/webui/app.js")
    etag = first.headers["ETag"]
    again = page_client.get("/webui/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.data == b""
    assert again.headers["ETag"] == etag
    assert page_client.get("/webui/app.js", headers={"If-None-Match": '"other"'}).status_code == 200


@pytest.mark.parametrize("path", ["/webui/nope.js", "/webui/index.html", "/webui/..%2Fsettings.py",
                                  "/webui/../api/webui.py", "/index.html"])
def test_only_the_listed_files(page_client, path):
    assert page_client.get(path).status_code == 404


def test_webui_off_leaves_root_a_404(fake_engine):
    client = make_client(fake_engine, webui="off")
    resp = client.get("/")
    assert resp.status_code == 404
    assert resp.get_json()["error"]["type"]  # the OpenAI error shape, as any unknown route
    assert client.get("/webui/app.js").status_code == 404


def test_webui_setting_from_the_environment(monkeypatch):
    from app.settings import Settings

    assert Settings().webui == "on"
    monkeypatch.setenv("WEBUI", "off")
    assert Settings().webui == "off"
    monkeypatch.setenv("WEBUI", "maybe")
    with pytest.raises(ValueError):
        Settings()


def test_with_keys_the_page_loads_without_one_and_the_api_still_needs_one(fake_engine):
    client = make_client(fake_engine, api_key="key-one")
    assert client.get("/").status_code == 200
    for name in webui.FILES:
        if name != "index.html":
            assert client.get(webui.PREFIX + name).status_code == 200
    assert client.get("/webui/nope.js").status_code == 401  # only the page's own files
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"x-api-key": "key-one"}).status_code == 200
    off = make_client(fake_engine, api_key="key-one", webui="off")
    assert off.get("/").status_code == 401  # nothing exempt when the page is off


def test_the_page_is_small():
    # plain files, nothing vendored, no build step: the page adds this much to the image
    assert webui.page_size() < 100_000


# ---- the page's own modules, in Chromium ---------------------------------------------------


@pytest.fixture(scope="module")
def browser_page():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page()

        def serve(route):
            name = route.request.url.rsplit("/", 1)[1]
            if name in webui.FILES:
                route.fulfill(body=(WEBUI / name).read_bytes(), content_type=webui.FILES[name],
                              headers={"Content-Security-Policy": webui.CSP})
            else:
                route.fulfill(status=200, body="<!doctype html><title>blank</title>",
                              content_type="text/html",
                              headers={"Content-Security-Policy": webui.CSP})

        page.route("http://webui.test/**", serve)
        page.goto("http://webui.test/blank")
        yield page
        browser.close()


def render(page, text: str) -> dict:
    return page.evaluate(
        """async (text) => {
            const md = await import("/webui/markdown.js");
            const div = document.createElement("div");
            div.append(md.render(text));
            return {html: div.innerHTML, text: div.textContent,
                    tags: [...div.querySelectorAll("*")].map((e) => e.tagName.toLowerCase()),
                    hrefs: [...div.querySelectorAll("a")].map((a) => a.getAttribute("href"))};
        }""",
        text,
    )


def test_markdown_blocks_and_inline(browser_page):
    out = render(browser_page, "# Title\n\nSome **bold**, *it*, `code` and [a link](https://x.test/a).\n\n"
                 "```python\nprint('<b>')\n```\n\n- one\n- two\n  - nested\n\n1. first\n2. second\n\n"
                 "> quoted\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n---\nline one\nline two")
    tags = out["tags"]
    for tag in ["h3", "strong", "em", "code", "a", "pre", "ul", "ol", "li", "blockquote", "table",
                "th", "td", "hr", "br"]:
        assert tag in tags, tag
    assert out["hrefs"] == ["https://x.test/a"]
    assert "print('<b>')" in out["text"]  # code stays text
    assert tags.count("ul") == 2  # the nested list


def test_an_unclosed_fence_renders_as_code_while_it_streams(browser_page):
    out = render(browser_page, "Here:\n```js\nlet a = 1;")
    assert "pre" in out["tags"] and "let a = 1;" in out["text"]


@pytest.mark.parametrize("hostile", [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "[click](javascript:alert(1))",
    "![x](https://evil.test/p.png)",
    "**<iframe src=//evil.test>**",
    "`<svg onload=alert(1)>`",
    "| <b>x</b> | y |\n|---|---|\n| <img src=x> | z |",
])
def test_model_output_never_becomes_markup(browser_page, hostile):
    out = render(browser_page, hostile)
    assert not set(out["tags"]) & {"img", "script", "iframe", "svg", "b"}
    assert all(h.startswith(("http://", "https://", "mailto:")) for h in out["hrefs"])
    assert "javascript:" not in "".join(out["hrefs"])


def test_sse_reader_counts_bytes_of_whole_events_only(browser_page):
    # events split at every byte, a multi-byte character cut in half, heartbeats between
    result = browser_page.evaluate(
        """async () => {
            const {readEvents} = await import("/webui/sse.js");
            const enc = new TextEncoder();
            const body = 'data: {"c":"h\u00e9llo \u4e16"}\\n\\n: ping\\n\\ndata: [DONE]\\n\\n';
            const bytes = enc.encode(body);
            const stream = new ReadableStream({start(c) {
                for (const b of bytes) c.enqueue(new Uint8Array([b]));
                c.close();
            }});
            const seen = [];
            await readEvents(stream, (ev, n) => seen.push([ev.comment, ev.data, n]));
            return {seen, total: bytes.length};
        }"""
    )
    seen = result["seen"]
    assert [s[1] for s in seen] == ['{"c":"h\u00e9llo \u4e16"}', None, "[DONE]"]
    assert [s[0] for s in seen] == [False, True, False]
    assert sum(s[2] for s in seen) == result["total"]
    counted = sum(s[2] for s in seen if not s[0])
    assert counted == result["total"] - len(b": ping\n\n")
