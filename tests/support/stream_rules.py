"""The stream rules real clients enforce, as checkers over a raw SSE body.

Each checker returns what the client would make of a stream: ``"ok"`` (a complete answer),
``"error"`` (it recognised the server's error event and reports it as such), or
``"broken: <why>"`` (a protocol failure: the client fails the request for the wrong reason).
They encode what each client's source does (see shared/ANCHORS.md "The stream rules"):

- HF inference-benchmarker: an event whose data starts with `{"error":` is an error; otherwise a
  stream without `data: [DONE]` fails with "Connection closed before completion".
- genai-perf: the body must contain `data: [DONE]`; every other data line must be a JSON object
  whose `object` is `chat.completion.chunk` (or `text_completion`).
- openai-python: parses each data event as JSON until `[DONE]` or the end of the response
  (no `[DONE]` is fine); an event with an `error` key raises APIError; comments are skipped.
"""

from __future__ import annotations

import json

CHUNK_OBJECTS = {"chat.completion.chunk", "text_completion"}


def data_lines(body: str) -> list[str]:
    return [ln[len("data: "):] for ln in body.split("\n") if ln.startswith("data: ")]


def inference_benchmarker(body: str) -> str:
    datas = data_lines(body)
    for d in datas:
        if d.startswith('{"error":'):
            return "error"
        if d != "[DONE]" and "error" in json.loads(d):
            return "broken: error event not recognised"
    return "ok" if "[DONE]" in datas else "broken: Connection closed before completion"


def genai_perf(body: str) -> str:
    if "data: [DONE]" not in body:
        return "broken: no [DONE]"
    outcome = "ok"
    for d in data_lines(body):
        if d == "[DONE]":
            continue
        obj = json.loads(d)
        if "error" in obj:
            outcome = "error"
        elif obj.get("object") not in CHUNK_OBJECTS:
            return f"broken: unknown object {obj.get('object')!r}"
    return outcome


def openai_python(body: str) -> str:
    for block in body.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        data = "\n".join(ln[len("data: "):] for ln in lines if ln.startswith("data: "))
        if data.startswith("[DONE]"):
            return "ok"
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            return "broken: data is not JSON"
        if obj.get("error"):
            return "error"
    return "ok"


CLIENTS = {
    "inference-benchmarker": inference_benchmarker,
    "genai-perf": genai_perf,
    "openai-python": openai_python,
}


def outcomes(body: str) -> dict[str, str]:
    return {name: check(body) for name, check in CLIENTS.items()}
