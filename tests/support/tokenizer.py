"""The default model's tokenizer in the test process (vocab only), to check exact token counts."""

from __future__ import annotations


def tokenizer():
    """The model's tokenizer (E2E_MODEL's when set, as the default_model fixture), loaded
    vocab-only in this process, to check exact token counts."""
    import os

    from llama_cpp import Llama

    from app.model.default import default_model_path
    from tests.support.server import model_cache_dir

    path = os.environ.get("E2E_MODEL") or str(default_model_path(model_cache_dir()))
    return Llama(path, vocab_only=True, verbose=False)
