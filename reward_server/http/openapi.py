"""The app's OpenAPI and methods beyond its routes: the request models the routes read themselves, and
HEAD on every GET route."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute


def with_request_schemas(app: FastAPI, models: tuple) -> None:
    """Add the request models (and what they reference) to the app's OpenAPI components."""
    base = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in js.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def answer_head(app: FastAPI) -> None:
    """HEAD on every GET route (monitors probe with it), as GET minus the body; kept out of the
    schema. FastAPI's routes take only the methods they name; uvicorn sends no body for HEAD."""
    for route in list(app.routes):
        if isinstance(route, APIRoute) and "GET" in route.methods and "HEAD" not in route.methods:
            app.add_api_route(
                route.path,
                route.endpoint,
                methods=["HEAD"],
                response_class=route.response_class,
                include_in_schema=False,
                name=f"{route.name}_head",
            )
