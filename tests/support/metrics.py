"""A running server's /metrics, parsed: samples by name and labels."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server import ServerProcess


def scrape(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = requests.get(server.url("/metrics"), timeout=30)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
