"""Schemathesis against the server's own OpenAPI schema: generated requests (mostly invalid, some
valid) must never produce a 5xx or an answer outside the schema. Runs against the real app on
127.0.0.1 (the fake engine: what is fuzzed is the HTTP and validation surface); the number of
cases per operation is printed. Hypothesis drives each operation directly (no pytest plugin),
so the test does not depend on the plugin's support for a given pytest release.

Schema-valid bodies may still be refused with 4xx (a file that does not exist, frames whose
bytes do not match their shape, two video sources): rules JSON Schema cannot state, so the
'schema-valid means accepted' check is not applied."""

from __future__ import annotations

import collections

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.servers import InProcessServer

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


def test_api_never_fails_and_matches_its_schema(tmp_path):
    cases: collections.Counter = collections.Counter()
    with InProcessServer(video_roots=[str(tmp_path)]) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {f"{op.method.upper()} {op.path}" for op in operations} >= {"POST /score", "POST /score/batch"}
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def run(case) -> None:
                cases[f"{case.method} {case.path}"] += 1
                case.call_and_validate(timeout=60, checks=CHECKS)

            run()
        assert server.service.status == "ok"
    print(f"\nschemathesis: {sum(cases.values())} cases: " + ", ".join(f"{k}={v}" for k, v in sorted(cases.items())))
    assert cases["POST /score"] >= 100 and cases["POST /score/batch"] >= 100, cases
