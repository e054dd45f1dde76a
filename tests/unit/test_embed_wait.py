"""How the core waits for an embedder's answer (app.core.embed.Embeddings.wait): a request that
runs past its deadline is counted as a timeout under its API's label, a hang-up as a
disconnect, and either cancels what is left of the request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.base.errors import ClientGone, GenerationTimeout
from app.base.metrics import Metrics
from app.core.embed import Embeddings


class Handle:
    def __init__(self, error: Exception):
        self.error = error
        self.cancelled = False

    def result(self, timeout: float | None = None) -> list:
        raise self.error

    def cancel(self) -> None:
        self.cancelled = True


def counted(metrics: Metrics, name: str, api: str) -> float:
    return metrics.registry.get_sample_value(f"vertex_gguf_{name}_total", {"api": api}) or 0


@pytest.mark.parametrize("error, name", [
    (GenerationTimeout("reranking exceeded the request timeout of 1 s"), "timeouts"),
    (ClientGone("the client went away"), "client_disconnects"),
])
def test_a_request_wide_failure_is_counted_under_its_api_and_cancels(error, name):
    metrics = Metrics()
    core = Embeddings(SimpleNamespace(metrics=metrics), True, 16, 1.0)  # type: ignore[arg-type]
    handle = Handle(error)
    with pytest.raises(type(error)):
        core.wait(handle, None, "rerank")  # type: ignore[arg-type]
    assert counted(metrics, name, "rerank") == 1
    assert counted(metrics, name, "embeddings") == 0
    assert handle.cancelled


class Waiting:
    """A handle whose answer has not come: every wait times out."""

    def __init__(self, gone_poll: float):
        self.gone_poll = gone_poll
        self.waits: list[float | None] = []
        self.cancelled = False

    def result(self, timeout: float | None = None) -> list:
        self.waits.append(timeout)
        raise TimeoutError

    def cancel(self) -> None:
        self.cancelled = True


@pytest.mark.parametrize("gone_poll", [0.5, 0.02])
def test_the_caller_checks_for_a_hang_up_as_often_as_its_handle_asks(gone_poll):
    """An engine process cannot ask the caller's socket itself (RemoteEmbedHandle asks for a
    check every 20 ms); an in-process embedder asks at every decode (the caller's check every
    0.5 s is a backstop). The third check finds the client gone: cancelled, counted."""
    from app.engine.embed import EmbedHandle
    from app.engine.remote import RemoteEmbedHandle

    assert RemoteEmbedHandle.gone_poll < EmbedHandle.gone_poll
    metrics = Metrics()
    core = Embeddings(SimpleNamespace(metrics=metrics), True, 16, 1.0)  # type: ignore[arg-type]
    handle = Waiting(gone_poll)
    checks = iter([False, False, True])
    with pytest.raises(ClientGone):
        core.wait(handle, lambda: next(checks), "embeddings")  # type: ignore[arg-type]
    assert handle.waits == [gone_poll] * 3
    assert handle.cancelled
    assert counted(metrics, "client_disconnects", "embeddings") == 1
