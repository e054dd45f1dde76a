"""Request parts that tests of more than one tier or file send: tool definitions, a JSON schema,
a code block to copy."""

ADD = {"type": "function", "function": {"name": "add_two_numbers", "description": "Add two integers",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
GOOD_TOOL = {"type": "function", "function": {"name": "add_two_numbers", "description": "Add",
             "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                            "required": ["a", "b"]}}}
PERSON_CHAT = {"messages": [{"role": "user", "content": "Describe a person as JSON."}]}
PERSON_SCHEMA = {
    "type": "object",
    # a bounded name: a sampled (temperature 0.7) string always closes within max_tokens
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

# a code block the speculation tests ask to have copied (tests/e2e/test_speculative.py and
# test_predicted_outputs.py)
CODE = """def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b
"""
