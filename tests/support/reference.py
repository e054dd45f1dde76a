"""An independent computation of log probabilities: llama-cpp-python's high-level ``Llama``
with logits at every position, evaluated on exactly the tokens the server reports, and
log-softmax in numpy (float64). Attention must be computed as the server computes it: run the
server with FLASH_ATTN=off. (With flash attention on, llama.cpp's CPU build takes the flash
kernel for a batch of one sequence but not for a batch of several, so a generated token's value
would depend on the other streams in its step, by up to 0.25 on this small model; a prompt being
scored is decoded alone either way.) And a generated token's logits come from a decode of that
one token, which llama.cpp computes along another path than a prompt's batch (they differ by up
to ~0.07 here): so the reference decodes a prompt in one batch, then each generated token on its
own, as the server did."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class Reference:
    def __init__(self, model: Path, n_ctx: int = 2048):
        from llama_cpp import Llama

        self.llm = Llama(str(model), logits_all=True, flash_attn=False, n_ctx=n_ctx,
                         n_batch=512, verbose=False)

    def rows(self, tokens: list[int], prompt: int | None = None) -> np.ndarray:
        """Log-softmax of the logits at every position of ``tokens`` (row i predicts i+1): the
        first ``prompt`` tokens (all by default) decoded in one batch, the rest one by one."""
        self.llm.reset()
        cut = len(tokens) if prompt is None else prompt
        self.llm.eval(tokens[:cut])
        for tok in tokens[cut:]:
            self.llm.eval([tok])
        raw = np.array(self.llm.scores[: len(tokens)], dtype=np.float64)
        peak = raw.max(axis=1, keepdims=True)
        return raw - (peak + np.log(np.exp(raw - peak).sum(axis=1, keepdims=True)))

    def token_logprobs(self, tokens: list[int], prompt: int | None = None) -> list[float | None]:
        """Each token's log probability given those before it (None for the first); ``prompt``
        as in :meth:`rows`."""
        rows = self.rows(tokens, prompt)
        return [None] + [float(rows[i - 1, t]) for i, t in enumerate(tokens) if i > 0]


def ids(tokens: list[str]) -> list[int]:
    """Token ids from names in vLLM's ``token_id:<id>`` form (return_tokens_as_token_ids)."""
    assert all(t.startswith("token_id:") for t in tokens), tokens[:5]
    return [int(t.removeprefix("token_id:")) for t in tokens]
