"""Chat templates rendered in a sandbox from the GGUF's own Jinja source."""

import pytest

from app.base.errors import BadRequest
from app.formats.chat_template import flatten_content, render

# SmolLM2-135M-Instruct's template, as its GGUF carries it.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def test_smollm2_template_adds_its_default_system_prompt():
    out = render(SMOLLM2, [{"role": "user", "content": "Hi"}])
    assert out == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_no_template_falls_back_to_chatml():
    out = render(None, [{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert out == "<|im_start|>user\nHi<|im_end|>\n"


def test_template_helpers_and_bos():
    tmpl = "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}{{ strftime_now('%Y') | length }}"
    out = render(tmpl, [{"role": "user", "content": "é"}], bos_token="<s>")
    assert out == '<s>{"role": "user", "content": "é"}4'


def test_raise_exception_is_a_400():
    tmpl = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(BadRequest, match="roles must alternate"):
        render(tmpl, [{"role": "user", "content": "x"}])


def test_broken_template_is_a_400():
    with pytest.raises(BadRequest, match="does not compile"):
        render("{% for %}", [])


def test_sandbox_blocks_attribute_escapes():
    tmpl = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(BadRequest):
        render(tmpl + "{{ ''.__class__.__subclasses__() }}", [])


def test_content_parts_are_flattened():
    assert flatten_content([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "m") == "ab"
    assert flatten_content(None, "m") == ""
    with pytest.raises(BadRequest) as exc:
        flatten_content([{"type": "image_url", "image_url": {}}], "messages.0")
    assert exc.value.param == "messages.0.content.0"


def info_with(template: str | None):
    from app.engine.types import ModelInfo

    return ModelInfo(name="m", path="m.gguf", n_ctx=512, n_ctx_train=512, chat_template=template,
                     bos_token="<s>", eos_token="</s>", created=0)


def test_the_opening_every_chat_starts_with():
    from app.core.plan import opening

    text = opening(info_with(SMOLLM2))
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\n")
    assert render(SMOLLM2, [{"role": "user", "content": "Hi"}]).startswith(text)
    assert opening(info_with(None)) == "<|im_start|>user\n"  # ChatML without a template


def test_a_template_that_cannot_say_its_opening_gives_none():
    from app.core.plan import opening

    assert opening(info_with("{{ raise_exception('no') }}")) is None
    assert opening(info_with("{{ messages[0]['content'] | upper }}")) is None  # words changed
