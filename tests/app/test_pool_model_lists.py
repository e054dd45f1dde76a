"""The Anthropic and Gemini shapes of the model list and cards on a server of several models
(app/edge/routes.py, app/api/gemini, app/api/anthropic/models.py): every model of the catalog,
loaded or not, one entry per name it answers to; a card for any of them, and a 404 in the
API's shape for a name no model has. OpenAI's list (with each model's status):
tests/app/test_pooled_models.py."""

from __future__ import annotations

from tests.support.pooled_app import chat, served

ANTHROPIC = {"anthropic-version": "2023-06-01"}
GOOGLE = {"x-goog-api-client": "google-genai-sdk/1.0"}
NAMES = ["alpha", "beta", "beta-alias", "gamma"]


def test_anthropics_list_shows_every_model_loaded_or_not():
    client, pool = served()
    try:
        body = client.get("/v1/models", headers=ANTHROPIC).get_json()
        assert [m["id"] for m in body["data"]] == NAMES
        assert body["has_more"] is False
        assert (body["first_id"], body["last_id"]) == ("alpha", "gamma")
        for m in body["data"]:
            assert set(m) == {"type", "id", "display_name", "created_at"}
            assert m["type"] == "model" and m["display_name"] == m["id"]
        by_id = {m["id"]: m for m in body["data"]}
        assert by_id["gamma"]["created_at"] == "1970-01-01T00:00:00Z"  # not loaded: not read
        assert by_id["alpha"]["created_at"] != "1970-01-01T00:00:00Z"  # loaded: its own
        assert statuses(client) == {"alpha": "loaded", "beta": "unloaded", "gamma": "unloaded"}
    finally:
        pool.shutdown()


def test_anthropics_card_answers_for_any_model_and_alias():
    client, pool = served()
    try:
        card = client.get("/v1/models/beta-alias", headers=ANTHROPIC)
        assert card.status_code == 200
        assert card.get_json()["id"] == "beta-alias" and card.get_json()["type"] == "model"
        assert client.get("/v1/models/gamma", headers=ANTHROPIC).get_json()["id"] == "gamma"
        missing = client.get("/v1/models/delta", headers=ANTHROPIC)
        assert missing.status_code == 404
        err = missing.get_json()
        assert err["type"] == "error" and err["error"]["type"] == "not_found_error"
        assert "alpha, beta, gamma" in err["error"]["message"]
        assert statuses(client)["gamma"] == "unloaded"  # a card never loads its model
    finally:
        pool.shutdown()


def test_geminis_list_shows_every_model_loaded_or_not():
    client, pool = served()
    try:
        assert chat(client, "beta").status_code == 200  # beta loaded: its limits are known
        for path, headers in (("/v1beta/models", {}), ("/v1/models", GOOGLE)):
            models = client.get(path, headers=headers).get_json()["models"]
            assert [m["name"] for m in models] == [f"models/{n}" for n in NAMES], path
            by_name = {m["baseModelId"]: m for m in models}
            assert by_name["beta"]["inputTokenLimit"] > 0
            assert by_name["alpha"]["outputTokenLimit"] > 0
            assert "inputTokenLimit" not in by_name["gamma"]  # not loaded: not known
            assert "generateContent" in by_name["gamma"]["supportedGenerationMethods"]
        assert statuses(client)["gamma"] == "unloaded"
    finally:
        pool.shutdown()


def test_geminis_card_answers_for_any_model_and_alias():
    client, pool = served()
    try:
        for path in ("/v1beta/models/gamma", "/v1beta/models/GAMMA"):
            card = client.get(path)
            assert card.status_code == 200, path
            assert card.get_json()["name"] == "models/gamma"
        card = client.get("/v1/models/models/beta-alias", headers=GOOGLE)
        assert card.status_code == 200 and card.get_json()["name"] == "models/beta-alias"
        for path, headers in (("/v1beta/models/delta", {}), ("/v1/models/delta", GOOGLE)):
            missing = client.get(path, headers=headers)
            assert missing.status_code == 404, path
            assert missing.get_json()["error"]["status"] == "NOT_FOUND"
            assert "alpha, beta, gamma" in missing.get_json()["error"]["message"], path
        assert statuses(client)["gamma"] == "unloaded"
    finally:
        pool.shutdown()


def test_openais_list_is_unchanged_by_the_other_shapes():
    client, pool = served()
    try:
        ids = [m["id"] for m in client.get("/v1/models").get_json()["data"]]
        assert ids == ["alpha", "beta", "gamma"]  # one card per model, aliases inside
    finally:
        pool.shutdown()


def statuses(client) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in client.get("/v1/models").get_json()["data"]}
