"""What a load runs before the model is ready (app.engine.warm_up): the full warm-up is the
first burst's work (a whole prefill chunk, every slot, a grammar); the light one, for a model a
request is waiting for, is one short prompt and one token. Checked on the jobs it enters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.base.errors import ModelLoadError
from app.engine.slots import Job
from app.engine.types import Finished
from app.engine.warm_up import warm_up


class _Tok:
    add_bos = True

    def tokens(self, text: str, add_bos: bool = False) -> list[int]:
        return [1] * add_bos + [ord(c) for c in text]


def _run(light: bool, parallel: int = 3, chunk: int = 64, n_ctx: int = 512) -> list[Job]:
    """warm_up's jobs, each finished by the step after it was entered."""
    entered: list[Job] = []
    cleared: list[bool] = []
    sched = SimpleNamespace(n_ctx=n_ctx, clear_kv=lambda: cleared.append(True))

    def step() -> None:
        for j in entered:
            if not j.done:
                j.done = True
                j.sink(Finished("length", len(j.request.prompt),
                                j.request.params.max_tokens))

    warm_up(sched, _Tok(), parallel, chunk, entered.append, step, light=light)  # type: ignore[arg-type]
    assert cleared == [True]  # its KV is no prefix anyone will reuse
    return entered


def test_full_warm_up_runs_the_first_bursts_work():
    jobs = _run(light=False)
    assert len(jobs) == 3  # every slot
    assert len(jobs[0].request.prompt) == 64  # a whole prefill chunk
    assert all(len(j.request.prompt) < 64 for j in jobs[1:])
    assert [j.request.params.grammar is not None for j in jobs] == [False, False, True]
    assert {j.request.params.max_tokens for j in jobs} == {4}


def test_light_warm_up_is_one_short_prompt_and_one_token():
    jobs = _run(light=True)
    assert len(jobs) == 1
    assert 1 <= len(jobs[0].request.prompt) <= 2  # llama-server's warm-up is 2 tokens
    assert jobs[0].request.params.max_tokens == 1
    assert jobs[0].request.params.grammar is None


def test_light_warm_up_fits_a_tiny_context():
    jobs = _run(light=True, n_ctx=6)
    assert len(jobs[0].request.prompt) == 1  # room for the token it generates


def test_a_warm_up_that_does_not_finish_fails_the_load():
    sched = SimpleNamespace(n_ctx=512, clear_kv=lambda: None)
    with pytest.raises(ModelLoadError, match="did not finish"):
        warm_up(sched, _Tok(), 1, 64, lambda j: None, lambda: None, light=True)  # type: ignore[arg-type]
