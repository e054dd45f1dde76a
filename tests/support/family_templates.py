"""Small chat templates that render a family's markers the way its model's own template does,
where the copies in tests/data/templates (llama.cpp's) were changed from the model's: DeepSeek
V3.1's own template joins the arguments as text and switches with ``thinking``; Kimi K2's own
writes each call's ``id`` and each result's ``tool_call_id`` as they are given."""

from __future__ import annotations

DEEPSEEK_V31 = (
    "{%- if not thinking is defined -%}{%- set thinking = false -%}{%- endif -%}"
    "{{ bos_token }}{%- for m in messages if m['role'] == 'system' -%}{{ m['content'] }}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{{ '<｜User｜>' + m['content'] }}"
    "{%- elif m['role'] == 'assistant' and m['tool_calls'] -%}{{ '<｜Assistant｜></think>' }}"
    "{%- if m['content'] is not none -%}{{ m['content'] }}{%- endif -%}{{ '<｜tool▁calls▁begin｜>' }}"
    "{%- for c in m['tool_calls'] -%}{{ '<｜tool▁call▁begin｜>' + c['function']['name'] + "
    "'<｜tool▁sep｜>' + c['function']['arguments'] + '<｜tool▁call▁end｜>' }}{%- endfor -%}"
    "{{ '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}"
    "{%- elif m['role'] == 'assistant' -%}{{ '<｜Assistant｜></think>' + m['content'] + "
    "'<｜end▁of▁sentence｜>' }}"
    "{%- elif m['role'] == 'tool' -%}{{ '<｜tool▁output▁begin｜>' + m['content'] + "
    "'<｜tool▁output▁end｜>' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and messages[-1]['role'] != 'tool' -%}{{ '<｜Assistant｜>' }}"
    "{{ '<think>' if thinking else '</think>' }}{%- endif -%}"
)
DEEPSEEK_TOKENS = ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>",
                   "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                   "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]

KIMI_K2 = (
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if m.get('reasoning_content') -%}<think>{{ m['reasoning_content'] }}</think>{%- endif -%}"
    "{{ m['content'] or '' }}"
    "{%- if m.get('tool_calls') -%}<|tool_calls_section_begin|>{%- for c in m['tool_calls'] -%}"
    "<|tool_call_begin|>{{ c['id'] }}<|tool_call_argument_begin|>"
    "{{ c['function']['arguments'] if c['function']['arguments'] is string "
    "else c['function']['arguments'] | tojson }}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}<|im_end|>"
    "{%- elif m['role'] == 'tool' -%}<|im_system|>tool<|im_middle|>## Return of "
    "{{ m['tool_call_id'] }}\n{{ m['content'] }}<|im_end|>"
    "{%- else -%}<|im_system|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
KIMI_TOKENS = ["<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|im_end|>",
               "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
               "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>"]
