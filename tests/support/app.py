"""The app in process over the fake engine: Flask's test client."""

from __future__ import annotations

from app import create_app
from app.engine.fake import FakeEngine
from app.settings import Settings


def make_client(engine: FakeEngine, **settings):
    app = create_app(Settings(**settings), engine=engine)
    app.testing = True
    return app.test_client()
