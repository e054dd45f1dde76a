"""End to end with the real default model: vLLM's tokenizer routes (GET /tokenizer_info, POST
/tokenize with ``prompt`` or ``messages``, POST /detokenize's ``prompt``) beside llama-server's,
behind an API key; and lm-eval's remote tokenizer (``tokenizer_backend=remote``) driving them,
when lm-eval is installed (a venv of its own: LMEVAL_PYTHON, .venv-lmeval or
/tmp/venv-lmeval)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import requests

from tests.support.lmeval import OFFLINE, require_lmeval
from tests.support.server import running_server

KEY = "sk-tokenizer-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
ASK = [{"role": "system", "content": "You are terse."},
       {"role": "user", "content": "Say <|im_start|>hi in French."}]
IM_START, IM_END = 1, 2  # SmolLM2's control tokens


@pytest.fixture(scope="module")
def srv(default_model):
    with running_server({"PARALLEL": "1", "API_KEY": KEY}) as server:
        yield server


def post(srv, path: str, body: dict, status: int = 200) -> dict:
    resp = requests.post(srv.url(path), json=body, headers=AUTH, timeout=60)
    assert resp.status_code == status, resp.text
    return resp.json()


def test_tokenizer_info(srv):
    info = requests.get(srv.url("/tokenizer_info"), headers=AUTH, timeout=10).json()
    assert info["eos_token"] == "<|im_end|>" and info["bos_token"] == "<|im_start|>"
    assert info["add_bos_token"] is False  # SmolLM2's GGUF asks for none
    assert info["model_max_length"] == info["max_model_len"] == 4096
    assert info["vocab_size"] == 49152 and info["vocab_type"] == "bpe"
    assert "<|im_start|>" in info["chat_template"]
    assert requests.get(srv.url("/tokenizer_info"), timeout=10).status_code == 401


def test_the_text_form_agrees_with_llama_servers(srv):
    text = "Hello, world! Grüße <|im_end|>"
    vllm = post(srv, "/tokenize", {"prompt": text, "add_special_tokens": False,
                                   "return_token_strs": True})
    llama = post(srv, "/tokenize", {"content": text})
    assert vllm["tokens"] == llama["tokens"] and vllm["count"] == len(llama["tokens"])
    assert vllm["tokens"][-1] == IM_END and vllm["max_model_len"] == 4096
    assert "".join(vllm["token_strs"]).startswith("Hello")
    back = post(srv, "/detokenize", {"tokens": vllm["tokens"]})
    assert back == {"content": text, "prompt": text}
    assert post(srv, "/tokenize", {"prompt": "<|im_end|>", "add_special_tokens": False})[
        "tokens"] == [IM_END]


def test_the_chat_form_counts_what_a_chat_request_counts(srv):
    body = post(srv, "/tokenize", {"messages": ASK})
    chat = post(srv, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1})
    assert body["count"] == chat["usage"]["prompt_tokens"] == len(body["tokens"])
    # the user's "<|im_start|>" stays text: control tokens only where the template puts them
    assert body["tokens"].count(IM_START) == 3  # system, user, and the assistant's cue
    bare = post(srv, "/tokenize", {"messages": ASK, "add_generation_prompt": False})
    assert body["tokens"][:bare["count"]] == bare["tokens"] and bare["count"] < body["count"]
    text = post(srv, "/detokenize", {"tokens": body["tokens"]})["prompt"]
    assert text.endswith("<|im_start|>assistant\n") and "Say <|im_start|>hi in French." in text


def test_errors_are_openai_shaped(srv):
    err = post(srv, "/tokenize", {"messages": ASK, "chat_template": "x"}, status=400)["error"]
    assert err["param"] == "chat_template" and err["type"] == "invalid_request_error"
    err = post(srv, "/tokenize", {}, status=400)["error"]
    assert "content" in err["message"] and "messages" in err["message"]


# Run with lm-eval's own interpreter: its remote tokenizer, and the completions model that
# builds one (tokenizer_backend=remote), against the server; the answers as JSON.
DRIVER = """
import json, sys
from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support
from lm_eval.models.openai_completions import LocalCompletionsAPI
base, key = sys.argv[1], sys.argv[2]
url = base + "/v1/completions"
out = {"supported": check_remote_tokenizer_support(url, auth_token=key),
       "refused_without_key": not check_remote_tokenizer_support(url, max_retries=1)}
tok = RemoteTokenizer(url, auth_token=key)
ids = tok.encode("The capital of France is")
out.update(eos_token=tok.eos_token, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
           ids=ids, text=tok.decode(ids), batch=tok.batch_decode([ids[:1], ids[1:]]),
           chat=tok.apply_chat_template([{"role": "user", "content": "Hi"}]))
lm = LocalCompletionsAPI(base_url=url, model="m", tokenizer_backend="remote", auth_token=key)
out.update(lm_eot=lm.eot_token_id, lm_prefix=lm.prefix_token_id,
           lm_encode=lm.tok_encode("The capital of France is"), lm_decode=lm.decode_batch([ids]))
print(json.dumps(out))
"""


def test_lm_evals_remote_tokenizer(srv, tmp_path):
    python = require_lmeval()
    env = {**os.environ, **OFFLINE}
    proc = subprocess.run([python, "-c", DRIVER, srv.base, KEY], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["supported"] is True and got["refused_without_key"] is True
    assert got["eos_token"] == "<|im_end|>" and got["eos_token_id"] == IM_END
    assert got["bos_token_id"] == IM_START
    ours = post(srv, "/tokenize", {"content": "The capital of France is"})["tokens"]
    assert got["ids"] == ours == got["lm_encode"]
    assert got["text"] == "The capital of France is" and got["lm_decode"] == [got["text"]]
    assert "".join(got["batch"]) == "The capital of France is"
    assert got["chat"].startswith("<|im_start|>") and "Hi" in got["chat"]
    assert got["lm_eot"] == IM_END and got["lm_prefix"] == IM_START
