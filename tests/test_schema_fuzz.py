"""Schemathesis against the server's own OpenAPI schema: generated requests (mostly invalid, some
valid) must never produce a 5xx or an answer outside the schema. Runs against a real server
(transformers engine, tiny checkpoint) on 127.0.0.1; the number of cases is printed.

Schema-valid bodies may still be refused with 4xx (a file that does not exist, frames whose
bytes do not match their shape, two video sources): rules JSON Schema cannot state, so the
'schema-valid means accepted' check is not applied."""

from __future__ import annotations

import collections

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.engine

CASES: collections.Counter = collections.Counter()


@pytest.fixture
def api_schema(hf_server):
    return schemathesis.openapi.from_url(f"{hf_server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_never_fails_and_matches_its_schema(case):
    CASES[f"{case.method} {case.path}"] += 1
    case.call_and_validate(
        timeout=120,
        checks=[not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance],
    )


def teardown_module(module):
    total = sum(CASES.values())
    print(f"\nschemathesis: {total} cases: " + ", ".join(f"{k}={v}" for k, v in sorted(CASES.items())))
