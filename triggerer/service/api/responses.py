"""The error answers routes document, so clients (and schemathesis) know every status."""

from __future__ import annotations

from typing import Any

from triggerer.service.api.schemas import Problem

Responses = dict[int | str, dict[str, Any]]

UNAUTHORIZED: Responses = {401: {"model": Problem, "description": "no valid bearer token"}}
FORBIDDEN: Responses = {
    403: {"model": Problem, "description": "the caller's role lacks the permission it needs"}
}
INVALID: Responses = {422: {"model": Problem, "description": "a value is not valid"}}
UNAVAILABLE: Responses = {503: {"model": Problem, "description": "the store does not answer"}}
NOT_FOUND: Responses = {404: {"model": Problem, "description": "what is named does not exist"}}
CONFLICT: Responses = {
    409: {"model": Problem, "description": "the state of what is named does not allow it"}
}
PROTECTED: Responses = {**UNAUTHORIZED, **INVALID, **UNAVAILABLE}
"""What any route behind the token check may answer besides its own."""


def as_json(responses: Responses) -> Responses:
    """``responses`` documented as JSON, for a route whose own answer is text (FastAPI would
    document them in the route's media type)."""
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    return {
        status: {"description": response["description"], "content": {"application/json": problem}}
        for status, response in responses.items()
    }
