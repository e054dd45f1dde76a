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
