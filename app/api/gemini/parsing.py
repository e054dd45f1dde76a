"""A Gemini API request (``GenerateContentRequest``, as the Google Gen AI SDK sends it on both
the Gemini API and Vertex AI): its contents, system instruction, tools, tool config and
generation config in the core's terms.

Field names are read in either spelling the JSON API takes (``generationConfig`` or
``generation_config``), never inside the caller's own data (a function's arguments or
response, a schema's properties). A field the API defines that changes nothing here is ignored
on purpose (``IGNORED``); one whose effect this server cannot give is refused (a 400 saying
why); anything else is a 400 naming it.
"""

from __future__ import annotations

import contextlib
import json
import re
from functools import partial
from typing import Any

from app.base.errors import BadRequest
from app.core.input import OutputFormat, ToolChoice, template_call
from app.core.media import Collected
from app.core.video import Clip
from app.engine.types import SamplingParams
from app.formats.chat_template import clean
from app.grammar.gate import GrammarTooComplex
from app.protocol import tools
from app.protocol.openai import MAX_STOP_CHARS

# Request fields, by consumer: read here / ignored on purpose (with why) / refused (with why).
REQUEST_FIELDS = frozenset({"model", "contents", "systemInstruction", "generationConfig",
                            "tools", "toolConfig"})
IGNORED = {
    "safetySettings": "no safety filter runs here",
    "labels": "no billing labels here",
    "serviceTier": "one tier",
    "modelArmorConfig": "no Model Armor here",
}
UNSUPPORTED = {
    "cachedContent": "cached contents are not stored: send the contents (every prompt prefix "
                     "is cached without being asked)",
}
CONFIG_FIELDS = frozenset({"temperature", "topP", "topK", "candidateCount", "maxOutputTokens",
                           "stopSequences", "seed", "presencePenalty", "frequencyPenalty",
                           "responseMimeType", "responseSchema", "responseJsonSchema",
                           "thinkingConfig"})
CONFIG_IGNORED = {
    "routingConfig": "one model", "modelSelectionConfig": "one model",
    "mediaResolution": "text only", "audioTimestamp": "text only",
    "enableEnhancedCivicAnswers": "no such answers here",
    "responseModalities": "text is the only modality (any other is refused)",
}
CONFIG_UNSUPPORTED = {
    "responseLogprobs": "log probabilities are on the OpenAI routes",
    "logprobs": "log probabilities are on the OpenAI routes",
    "speechConfig": "this server writes text only",
    "enableAffectiveDialog": "not supported",
    "translationConfig": "not supported",
    "audioTranscriptionConfig": "this server takes text only",
    "imageConfig": "this server writes text only",
    "responseFormat": "use responseMimeType with responseJsonSchema",
}
EFFORTS = {"LOW": 256, "MEDIUM": 1024, "HIGH": 4096, "MINIMAL": 64}


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def camel(name: str) -> str:
    """A field's name as camelCase (``generation_config`` -> ``generationConfig``)."""
    return re.sub(r"(?<=[a-z0-9])_([a-z])", lambda m: m.group(1).upper(), name)


def get(d: dict[str, Any], name: str) -> Any:
    """A field by its camelCase name, or the snake_case one the JSON API takes too."""
    value = d.get(name)
    return d.get(snake(name)) if value is None else value


def check_keys(d: Any, where: str, known: frozenset[str], ignored: dict[str, str],
               refused: dict[str, str]) -> dict[str, Any]:
    """``d`` as an object whose keys (either spelling) are known, ignored, or refused."""
    if not isinstance(d, dict):
        raise BadRequest(f"{where}: must be an object" if where else
                         "request body must be a JSON object", param=where or None)
    for key, value in d.items():
        name = camel(key)
        at = f"{where}.{name}" if where else name
        if value is None or name in known or name in ignored:
            continue
        if name in refused:
            raise BadRequest(f"{at}: this server does not support this field ({refused[name]})",
                             param=at)
        raise BadRequest(f"{at}: this server does not support this field (see docs/gemini.md)",
                         param=at)
    return d


# ---- schemas ------------------------------------------------------------------------------------

_SCHEMA_DROP = {"propertyOrdering", "property_ordering", "example", "nullable"}


def json_schema(schema: Any, where: str, max_properties: int | None = None) -> dict[str, Any]:
    """Gemini's OpenAPI-style Schema (types in capitals, ``nullable``, ``propertyOrdering``) as
    JSON Schema; a JSON Schema passes through unchanged.

    Without recursion, and a node's path is joined only for its error (a path string built for
    every node cost the length of the names above it: quadratic); properties are counted as
    they are met, so a schema over ``max_properties`` (GRAMMAR_MAX_PROPERTIES, which the
    grammar converter enforces too) is refused before the rest of it is converted."""
    root: dict[str, Any] = {}
    counted = 0
    # (a schema, the dict its conversion fills, its path: (the parent's path, *keys) or ())
    todo: list[tuple[Any, dict[str, Any], tuple[Any, ...]]] = [(schema, root, ())]
    while todo:
        node, out, path = todo.pop()
        if not isinstance(node, dict):
            at = _schema_path(where, path)
            raise BadRequest(f"{at}: must be a schema object", param=at)
        children: list[tuple[Any, dict[str, Any], tuple[Any, ...]]] = []
        for key, value in node.items():
            if key in _SCHEMA_DROP:
                continue
            name = camel(key)
            if name == "type" and isinstance(value, str):
                value = value.lower()
                if value == "type_unspecified":
                    continue
            elif name == "properties" and isinstance(value, dict):
                counted += len(value)
                if max_properties is not None and counted > max_properties:
                    raise GrammarTooComplex(f"{where}: more than {max_properties} properties "
                                            "(GRAMMAR_MAX_PROPERTIES)", param=where)
                value = {k: _slot(children, v, (path, "properties", k)) for k, v in value.items()}
            elif name in ("items", "additionalProperties") and isinstance(value, dict):
                value = _slot(children, value, (path, name))
            elif name in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
                value = [_slot(children, v, (path, name, i)) for i, v in enumerate(value)]
            out[name] = value
        if node.get("nullable") is True and isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        todo.extend(reversed(children))  # depth first, in the schema's order
    return root


def _slot(children: list[tuple[Any, dict[str, Any], tuple[Any, ...]]], schema: Any,
          path: tuple[Any, ...]) -> dict[str, Any]:
    """An empty dict that ``schema``'s conversion will fill, queued in ``children``."""
    out: dict[str, Any] = {}
    children.append((schema, out, path))
    return out


def _schema_path(where: str, path: tuple[Any, ...]) -> str:
    """``where`` and the keys down to a node, as ``where.properties.name``."""
    parts: list[str] = []
    while path:
        parent, *keys = path
        parts.extend(str(k) for k in reversed(keys))
        path = parent
    return ".".join([where, *reversed(parts)])


# ---- contents -----------------------------------------------------------------------------------

_PART_KEYS = frozenset({"text", "thought", "thoughtSignature", "functionCall", "functionResponse",
                        "inlineData", "fileData", "partMetadata", "videoMetadata",
                        "executableCode", "codeExecutionResult", "mediaResolution"})


def _parts(content: Any, where: str, media_ok: bool = False) -> list[dict[str, Any]]:
    """A Content's parts, checked; ``inlineData`` and ``fileData`` (images) only where
    ``media_ok`` (a user turn)."""
    if not isinstance(content, dict):
        raise BadRequest(f"{where}: must be a Content object", param=where)
    parts = get(content, "parts")
    if not isinstance(parts, list):
        raise BadRequest(f"{where}.parts: must be a list", param=f"{where}.parts")
    refused = ("executableCode", "codeExecutionResult") if media_ok else (
        "inlineData", "fileData", "executableCode", "codeExecutionResult")
    for j, part in enumerate(parts):
        at = f"{where}.parts.{j}"
        check_keys(part, at, _PART_KEYS, {}, {})
        for kind in refused:
            if get(part, kind) is not None:
                why = ("images come in a user turn" if kind in ("inlineData", "fileData")
                       else "this server takes text, images and function calls only")
                raise BadRequest(f"{at}.{kind}: {why}", param=f"{at}.{kind}")
    return parts


def _image(part: dict[str, Any], at: str, take: Collected | None) -> str | None:
    """An image's (or a sound's) MEDIA mark (``take`` has it), or None for any other part:
    ``inlineData`` (base64 bytes) or ``fileData`` (a gs:// or https URI, read only where the
    operator allows it)."""
    inline, file = get(part, "inlineData"), get(part, "fileData")
    if inline is None and file is None:
        return None
    if take is None:
        raise BadRequest(f"{at}: images are not taken here", param=at)
    kind, blob = ("inlineData", inline) if inline is not None else ("fileData", file)
    if not isinstance(blob, dict):
        raise BadRequest(f"{at}.{kind}: must be an object", param=f"{at}.{kind}")
    mime = get(blob, "mimeType")
    mime = mime if isinstance(mime, str) else ""
    if mime and not mime.startswith(("image/", "video/", "audio/wav", "audio/x-wav",
                                     "audio/wave")):
        raise BadRequest(f"{at}.{kind}.mimeType: {mime!r}: this server takes images, video "
                         "and WAV audio only", param=f"{at}.{kind}.mimeType")
    read = take.take_audio if mime.startswith("audio/") else take.take
    if mime.startswith("video/"):
        clip = _clip(get(part, "videoMetadata"), f"{at}.videoMetadata")
        read = partial(_take_video, take, clip)
    if kind == "inlineData":
        data = get(blob, "data")
        if not isinstance(data, str):
            raise BadRequest(f"{at}.inlineData.data: must be base64", param=f"{at}.inlineData.data")
        return read(data, f"{at}.inlineData.data")
    uri = get(blob, "fileUri")
    if not isinstance(uri, str) or not uri.startswith(("gs://", "https://", "http://")):
        raise BadRequest(f"{at}.fileData.fileUri: must be a gs:// or https URI",
                         param=f"{at}.fileData.fileUri")
    return read(uri, f"{at}.fileData.fileUri")


def _take_video(take: Collected, clip: Clip | None, url: str, param: str) -> str:
    return take.take_video(url, param, clip)


def _clip(meta: Any, at: str) -> Clip | None:
    """``videoMetadata``: ``startOffset`` and ``endOffset`` (durations, "1.5s"), ``fps``
    (0 < fps <= 24, as Gemini takes it)."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise BadRequest(f"{at}: must be an object", param=at)
    start, end = (_seconds(get(meta, k), f"{at}.{k}") for k in ("startOffset", "endOffset"))
    fps = get(meta, "fps")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, int | float)
                            or not 0 < fps <= 24):
        raise BadRequest(f"{at}.fps: must be a number above 0, at most 24", param=f"{at}.fps")
    if start is not None and end is not None and end <= start:
        raise BadRequest(f"{at}.endOffset: must come after startOffset", param=f"{at}.endOffset")
    return Clip(start or 0.0, end, float(fps) if fps is not None else None)


def _seconds(value: Any, at: str) -> float | None:
    """A protobuf Duration as JSON writes it ("3.5s"), or a number of seconds."""
    if value is None:
        return None
    if isinstance(value, str) and value.endswith("s"):
        with contextlib.suppress(ValueError):
            value = float(value[:-1])
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e7:
        raise BadRequest(f"{at}: must be a duration such as \"1.5s\"", param=at)
    return float(value)


def system_text(instruction: Any) -> str | None:
    if instruction is None:
        return None
    if isinstance(instruction, str):
        return instruction
    return "\n\n".join(str(get(p, "text") or "") for p in _parts(instruction, "systemInstruction"))


def messages(contents: Any, take: Collected | None = None) -> list[dict[str, Any]]:
    """``contents`` as chat-template messages. A ``model`` turn's function calls become the
    assistant's tool calls (ids ``call_<turn>_<n>`` unless the call has one); a ``user`` turn's
    function responses become tool messages, matched to the calls by id, else by name, and
    its images go to ``take`` (_image)."""
    if not isinstance(contents, list) or not contents:
        raise BadRequest("contents: must be a non-empty list", param="contents")
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, name) not answered yet
    for i, content in enumerate(contents):
        where = f"contents.{i}"
        if isinstance(content, dict):
            check_keys(content, where, frozenset({"role", "parts"}), {}, {})
        role = (get(content, "role") if isinstance(content, dict) else None) or "user"
        if role not in ("user", "model", "function"):
            raise BadRequest(f"{where}.role: must be user or model", param=f"{where}.role")
        parts = _parts(content, where, media_ok=role == "user")
        if role == "model":
            texts, thoughts, calls = [], [], []
            for j, part in enumerate(parts):
                call = get(part, "functionCall")
                if call is not None:
                    name = get(call, "name") if isinstance(call, dict) else None
                    if not isinstance(name, str):
                        raise BadRequest(f"{where}.parts.{j}.functionCall.name: required",
                                         param=f"{where}.parts.{j}.functionCall.name")
                    cid = get(call, "id") or f"call_{i}_{j}"
                    pending.append((cid, name))
                    calls.append(template_call(cid, name, get(call, "args") or {}))
                elif get(part, "thought"):
                    thoughts.append(str(get(part, "text") or ""))
                else:
                    texts.append(str(get(part, "text") or ""))
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if thoughts:
                msg["reasoning_content"] = "".join(thoughts)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        texts = []
        for j, part in enumerate(parts):
            resp = get(part, "functionResponse")
            if resp is None:
                mark = _image(part, f"{where}.parts.{j}", take)
                texts.append(mark if mark is not None else clean(str(get(part, "text") or "")))
                continue
            if texts:
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            name = get(resp, "name") if isinstance(resp, dict) else None
            rid = get(resp, "id") if isinstance(resp, dict) else None
            match = next((p for p in pending if p[0] == rid), None) or next(
                (p for p in pending if p[1] == name), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
            body = get(resp, "response") if isinstance(resp, dict) else None
            msg = {"role": "tool", "content": json.dumps(body if body is not None else {},
                                                         ensure_ascii=False)}
            if match is not None:
                msg["tool_call_id"] = match[0]
            if name:
                msg["name"] = name
            out.append(msg)
        if texts or not parts:
            out.append({"role": "user", "content": "".join(texts)})
    return out


# ---- tools --------------------------------------------------------------------------------------

_DECL_KEYS = frozenset({"name", "description", "parameters", "parametersJsonSchema", "response",
                        "responseJsonSchema", "behavior"})
_HOSTED = frozenset({"googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext",
                     "retrieval", "googleMaps", "enterpriseWebSearch", "computerUse",
                     "fileSearch"})


def parse_tools(raw: Any, max_tools: int, max_properties: int | None = None
                ) -> tuple[tools.Tool, ...]:
    """``tools``: each a ``Tool`` whose ``functionDeclarations`` are offered; Google's hosted
    tools (search, code execution, ...) are refused, since they run on Google's side."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRequest("tools: must be a list", param="tools")
    out: list[tools.Tool] = []
    for i, tool in enumerate(raw):
        where = f"tools.{i}"
        check_keys(tool, where, frozenset({"functionDeclarations"}), {}, {
            name: "it runs on Google's side; this server offers function declarations only"
            for name in _HOSTED})
        decls = get(tool, "functionDeclarations") or []
        if not isinstance(decls, list):
            raise BadRequest(f"{where}.functionDeclarations: must be a list",
                             param=f"{where}.functionDeclarations")
        for j, decl in enumerate(decls):
            at = f"{where}.functionDeclarations.{j}"
            check_keys(decl, at, _DECL_KEYS, {}, {})
            schema = get(decl, "parametersJsonSchema")
            if schema is None and get(decl, "parameters") is not None:
                schema = json_schema(get(decl, "parameters"), f"{at}.parameters",
                                     max_properties)
            out.append(tools.make_tool(get(decl, "name"), get(decl, "description"), schema, at,
                                       f"{at}.name", f"{at}.parameters"))
    return tools.check_tools(out, max_tools)


def tool_choice(config: Any, offered: tuple[tools.Tool, ...]) -> tuple[ToolChoice, tuple]:
    """``toolConfig.functionCallingConfig``: AUTO, ANY (a call; with ``allowedFunctionNames``,
    one of those), NONE; VALIDATED is AUTO with every call held to its schema (as here always)."""
    if config is None:
        return ToolChoice(), offered
    check_keys(config, "toolConfig", frozenset({"functionCallingConfig"}),
               {"retrievalConfig": "no retrieval here"}, {})
    fcc = get(config, "functionCallingConfig") or {}
    check_keys(fcc, "toolConfig.functionCallingConfig", frozenset({"mode",
               "allowedFunctionNames"}), {"streamFunctionCallArguments": "calls stream whole"},
               {})
    mode = str(get(fcc, "mode") or "AUTO").upper()
    allowed = get(fcc, "allowedFunctionNames")
    param = "toolConfig.functionCallingConfig.mode"
    if allowed:
        names = set(allowed)
        missing = names - {t.name for t in offered}
        if missing:
            raise BadRequest(f"toolConfig.functionCallingConfig.allowedFunctionNames: "
                             f"{sorted(missing)} are not declared",
                             param="toolConfig.functionCallingConfig.allowedFunctionNames")
        offered = tuple(t for t in offered if t.name in names)
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return ToolChoice("auto", param=param), offered
    if mode == "NONE":
        return ToolChoice("none", param=param), offered
    if mode == "ANY":
        if len(offered) == 1:
            return ToolChoice("named", offered[0].name, param=param), offered
        return ToolChoice("required", param=param), offered
    raise BadRequest(f"{param}: must be AUTO, ANY, NONE or VALIDATED", param=param)


# ---- generation config --------------------------------------------------------------------------


def generation(config: Any, max_properties: int | None = None
               ) -> tuple[SamplingParams, OutputFormat | None, int, bool, int | None]:
    """``generationConfig``: (sampling, an output format, candidates, whether thoughts come
    back, a thought budget); ``max_properties`` bounds ``responseSchema`` as it is read."""
    if config is None:
        return SamplingParams(temperature=None, top_p=None, top_k=None, min_p=None,
                              max_tokens_param="generationConfig.maxOutputTokens"), None, 1, \
            False, None
    check_keys(config, "generationConfig", CONFIG_FIELDS, CONFIG_IGNORED, CONFIG_UNSUPPORTED)
    modalities = get(config, "responseModalities")
    if modalities and any(str(m).upper() != "TEXT" for m in modalities):
        raise BadRequest("generationConfig.responseModalities: this server writes TEXT only",
                         param="generationConfig.responseModalities")
    stops = get(config, "stopSequences") or []
    if not isinstance(stops, list) or len(stops) > 16 or any(
            not isinstance(s, str) or len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"generationConfig.stopSequences: at most 16 strings of at most "
                         f"{MAX_STOP_CHARS} characters", param="generationConfig.stopSequences")
    params = SamplingParams(
        max_tokens=_int(config, "maxOutputTokens", 1),
        max_tokens_param="generationConfig.maxOutputTokens",
        temperature=_num(config, "temperature", 0, 2),
        top_p=_num(config, "topP", 0, 1),
        top_k=_int(config, "topK", 0),
        min_p=None,
        seed=_int(config, "seed", -2**31),
        stop=tuple(s for s in stops if s),
        presence_penalty=_num(config, "presencePenalty", -2, 2) or 0.0,
        frequency_penalty=_num(config, "frequencyPenalty", -2, 2) or 0.0,
    )
    output = None
    mime = get(config, "responseMimeType")
    schema = get(config, "responseJsonSchema")
    if schema is None and get(config, "responseSchema") is not None:
        schema = json_schema(get(config, "responseSchema"), "generationConfig.responseSchema",
                             max_properties)
    if mime not in (None, "text/plain", "application/json"):
        raise BadRequest("generationConfig.responseMimeType: text/plain or application/json",
                         param="generationConfig.responseMimeType")
    if schema is not None:
        output = OutputFormat("json_schema", schema, "generationConfig.responseJsonSchema")
    elif mime == "application/json":
        output = OutputFormat("json_object", param="generationConfig.responseMimeType")
    n = _int(config, "candidateCount", 1) or 1
    thinking = get(config, "thinkingConfig") or {}
    check_keys(thinking, "generationConfig.thinkingConfig", frozenset({
        "includeThoughts", "thinkingBudget", "thinkingLevel"}), {}, {})
    budget = get(thinking, "thinkingBudget")
    level = get(thinking, "thinkingLevel")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
        raise BadRequest("generationConfig.thinkingConfig.thinkingBudget: a whole number",
                         param="generationConfig.thinkingConfig.thinkingBudget")
    if budget is not None and budget < 0:  # -1: dynamic, the model decides
        budget = None
    if budget is None and level is not None:
        budget = EFFORTS.get(str(level).upper())
    return params, output, n, bool(get(thinking, "includeThoughts")), budget


def _num(d: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = get(d, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequest(f"generationConfig.{name}: a number from {low} to {high}",
                         param=f"generationConfig.{name}")
    return float(value)


def _int(d: dict[str, Any], name: str, low: int) -> int | None:
    value = get(d, name)
    if value is None:
        return None
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < low:  # the SDK sends topK as 40.0
        raise BadRequest(f"generationConfig.{name}: a whole number of at least {low}",
                         param=f"generationConfig.{name}")
    return int(value)
