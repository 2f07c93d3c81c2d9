"""Property-based tests of the Batch API from its own OpenAPI schema (schemathesis, driven
through hypothesis directly: its pytest plugin does not load under pytest 9): every operation,
with generated (mostly hostile) parameters and bodies and a valid key, answers no 5xx and
nothing that breaks the published schema (status codes, content types, bodies)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import Api

pytestmark = pytest.mark.kafka
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_every_operation_answers_without_server_errors_or_schema_violations(api: Api) -> None:
    schema = schemathesis.openapi.from_url(api.base_url.removesuffix("/v1") + "/openapi.json")
    key = api.tenant("schema")[1]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/files", "GET /v1/files", "GET /v1/files/{file_id}",
                                               "GET /v1/files/{file_id}/content", "DELETE /v1/files/{file_id}",
                                               "POST /v1/batches", "GET /v1/batches", "GET /v1/batches/{batch_id}",
                                               "POST /v1/batches/{batch_id}/cancel"}
    calls: dict[str, int] = {}

    def exercise(operation) -> None:  # one closure per operation (hypothesis refuses defaulted args)
        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {key}"}, checks=CHECKS)
            calls[operation.label] = calls.get(operation.label, 0) + 1

        run()

    for operation in operations:
        exercise(operation)
    assert all(n > 0 for n in calls.values()) and len(calls) == len(operations), calls
