"""Request parts that tests of more than one tier send: tool definitions, a JSON schema."""

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
