"""Shared client drives: real agent clients against a running server (the tool-call tests),
and a paused fake-engine stream for the in-process tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any


def langchain_streamed_call(base_url: str, tools: list[dict[str, Any]], name: str) -> Any:
    """LangChain ``bind_tools`` streaming a forced call; the chunks merged the way LangChain does."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base_url, api_key="x", model="m", temperature=0, max_tokens=80,
                     streaming=True, max_retries=0)
    merged = None
    for chunk in llm.bind_tools(tools, tool_choice=name).stream("What is 3 plus 4?"):
        merged = chunk if merged is None else merged + chunk
    return merged


def pydantic_ai_streamed_sum(base_url: str, api: str = "openai") -> tuple[Any, set[str]]:
    """pydantic-ai streaming a structured output (an output tool) through its model for ``api``
    ("openai": Chat Completions, "anthropic": Messages): the output and the names of every tool
    call in the run."""
    from pydantic import BaseModel
    from pydantic_ai import Agent

    class Sum(BaseModel):
        a: int
        b: int

    if api == "anthropic":
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        model: Any = AnthropicModel("m", provider=AnthropicProvider(base_url=base_url, api_key="x"))
    else:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=base_url, api_key="x"))
    agent = Agent(model, output_type=Sum, model_settings={"temperature": 0, "max_tokens": 80})

    async def run():
        async with agent.run_stream("Give the two numbers in: what is 3 plus 4?") as result:
            return await result.get_output(), result.all_messages()

    output, messages = asyncio.run(run())
    assert isinstance(output, Sum)
    return output, {p.tool_name for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-call"}


@contextlib.contextmanager
def paused_stream(client: Any, engine: Any, body: dict[str, Any],
                  path: str = "/v1/chat/completions") -> Iterator[tuple[Any, Iterator[bytes]]]:
    """A streamed request to the fake engine, read up to its first word (the caller set
    ``engine.hold_after``, so the generation is paused there); yields the response and its
    frames; on exit the generation is resumed and the response closed."""
    resp = client.post(path, json={**body, "stream": True}, buffered=False)
    frames = iter(resp.response)
    try:
        for _ in range(10):  # the role chunk, then the first word
            if b"Hello" in next(frames):
                break
        yield resp, frames
    finally:
        engine.resume.set()
        resp.close()
