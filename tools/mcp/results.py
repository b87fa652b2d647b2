"""A ``CallToolResult`` as a JSON value the journal records and the model reads.

Structured content, when the server sends it, is the value. Otherwise text
blocks are the value (one text as a string); other blocks are described
without their payload (an image's base64, a blob), which a chat model
cannot use as a tool result and the journal should not carry.
"""

import json
from typing import Any

#: The most of a result the journal keeps (as the HTTP tools cut a body):
#: a larger one is cut, as JSON text, and marked ``truncated``.
RESULT_CHARS = 64_000

#: Fields of a content block kept when the block is not text.
_KEPT = ("type", "mimeType", "uri", "name", "title", "description", "text")


def result_value(result) -> Any:
    value = _value(result)
    text = json.dumps(value, sort_keys=True)
    if len(text) <= RESULT_CHARS:
        return value
    return {"truncated": True, "json": text[:RESULT_CHARS]}


def cut_value(start: str) -> dict:
    """An answer cut at the cap on one message (``limits``), as a result
    cut here is: its text, marked ``truncated``."""
    return {"truncated": True, "json": start[:RESULT_CHARS]}


def error_text(result) -> str:
    """What a result with ``isError`` says, cut to a few thousand characters."""
    value = _value(result)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:4000]


def _value(result) -> Any:
    if result.structured_content is not None and not result.is_error:
        return result.structured_content
    blocks = [
        block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
    ]
    if all(block.get("type") == "text" for block in blocks):
        texts = [block.get("text", "") for block in blocks]
        return texts[0] if len(texts) == 1 else texts
    return [_described(block) for block in blocks]


def _described(block: dict) -> dict:
    if block.get("type") == "text":
        return {"type": "text", "text": block.get("text", "")}
    kept = {key: block[key] for key in _KEPT if key in block}
    resource = block.get("resource")
    if isinstance(resource, dict):
        kept["resource"] = {key: resource[key] for key in _KEPT if key in resource}
    return kept
