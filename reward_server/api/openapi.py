"""What the routes say of themselves in OpenAPI: the error answers of each dialect, and the schema
of a body a route reads itself (the routes stream their bodies, so FastAPI never sees a model)."""

from __future__ import annotations

from reward_protocol import raw_batch
from reward_protocol.chat import OpenAIErrorBody
from reward_protocol.score import ErrorBody

JSON = "application/json"
ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 408, 411, 413, 415, 422, 500, 503, 504)}
OPENAI_ERRORS = {code: {"model": OpenAIErrorBody} for code in (*ERRORS, 404)}


def body_schema(model, raw: bool = False) -> dict:
    """OpenAPI for a body the route reads itself (validated by `model`); `raw` adds the raw batch."""
    content = {JSON: {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    if raw:
        content[raw_batch.CONTENT_TYPE] = {
            "schema": {
                "type": "string",
                "format": "binary",
                "description": "raw batch: b'RWB1', header length (uint32 LE), RawBatchHeader JSON, frame bytes "
                "(reward_protocol/raw_batch.py)",
            }
        }
    return {"requestBody": {"required": True, "content": content}}
