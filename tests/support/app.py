"""The app in process over the fake engine: Flask's test client, and openai-python over it."""

from __future__ import annotations

import httpx
from openai import OpenAI

from app import create_app
from app.engine.fake import FakeEngine
from app.settings import Settings


def make_client(engine: FakeEngine, **settings):
    app = create_app(Settings(**settings), engine=engine)
    app.testing = True
    return app.test_client()


def sdk(client) -> OpenAI:
    """openai-python with its HTTP calls answered by the Flask test client."""

    def handle(req: httpx.Request) -> httpx.Response:
        headers = [(k, v) for k, v in req.headers.items() if k.lower() not in ("host", "content-length")]
        resp = client.open(req.url.path, method=req.method, data=req.content, headers=headers,
                           query_string=req.url.query)
        return httpx.Response(resp.status_code, headers=list(resp.headers.items()),
                              content=resp.get_data())

    return OpenAI(base_url="http://test/v1", api_key="x", max_retries=0,
                  http_client=httpx.Client(transport=httpx.MockTransport(handle)))
