"""A child process that compiles grammars with the real llama.cpp (vocab only) and probes them.

Reads one JSON object per line on stdin (``{"grammar": "..."}``), answers one per line:
``{"parsed": bool, "allowed": int}``. Run by tests/unit/test_grammar_fuzz.py, which watches it with
a timeout: a crash or a hang in llama.cpp fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import sys


def main(model: str) -> None:
    import llama_cpp
    from llama_cpp import llama_cpp as ll

    from app.engine.sampling import GrammarDeadEnd, GrammarSpec, Sampler, Vocab, compile_grammar
    from app.engine.types import SamplingParams

    llama_cpp._logger.set_verbose(False)
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model_ptr = ll.llama_model_load_from_file(model.encode(), params)
    vocab = Vocab(ll, ll.llama_model_get_vocab(model_ptr))
    for line in sys.stdin:
        text = json.loads(line)["grammar"]
        ptr = compile_grammar(vocab, text)
        out: dict = {"parsed": ptr is not None, "allowed": 0}
        if ptr is not None:
            # no step-time limit: this worker looks for crashes and hangs (the test's timeout),
            # and a busy machine would make a wide first step "too slow" by chance
            sampler = Sampler(vocab, SamplingParams(grammar=text), 0, ptr, GrammarSpec(text),
                              max_step_s=float("inf"))
            try:
                sampler.probe()
                out["allowed"] = len(sampler.allowed(None))
            except GrammarDeadEnd:
                out["allowed"] = 0
            sampler.free()
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
