"""Tenants cannot see each other, and keys are checked: the official openai SDK against a
real Batch API on the real broker.

- tenant B gets 404 for each of tenant A's files and batches (retrieve, content, delete,
  create from A's file, cancel), and lists only its own;
- no key, an unknown key and a revoked key are refused (401); repeated failures get 429.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from phaseroute.api import registry
from phaseroute.api.auth import FailureLimiter
from phaseroute.config import load_settings

from .conftest import Api, wait_until

pytestmark = pytest.mark.kafka
LINE = {"custom_id": "q0", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "smollm2-135m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}}


def _client(api: Api, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=api.base_url, max_retries=0)


@pytest.fixture(scope="module")
def two(api: Api):
    (a, key_a), (b, key_b) = api.tenant("iso-a"), api.tenant("iso-b")
    client_a = _client(api, key_a)
    uploaded = client_a.files.create(file=("in.jsonl", (json.dumps(LINE) + "\n").encode()), purpose="batch")
    batch = client_a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    return {"a": client_a, "b": _client(api, key_b), "file": uploaded, "batch": batch, "names": (a, b)}


def test_another_tenants_objects_are_not_found(two) -> None:
    b, file_id, batch_id = two["b"], two["file"].id, two["batch"].id
    calls = {
        "files.retrieve": lambda: b.files.retrieve(file_id),
        "files.content": lambda: b.files.content(file_id),
        "files.delete": lambda: b.files.delete(file_id),
        "batches.create": lambda: b.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                   completion_window="24h"),
        "batches.retrieve": lambda: b.batches.retrieve(batch_id),
        "batches.cancel": lambda: b.batches.cancel(batch_id),
    }
    for call in calls.values():
        with pytest.raises(openai.NotFoundError):
            call()
    assert file_id not in {f.id for f in b.files.list()}
    assert batch_id not in {x.id for x in b.batches.list()}
    # and the owner still has everything
    assert two["a"].files.retrieve(file_id).bytes == two["file"].bytes
    assert two["a"].batches.retrieve(batch_id).status in ("validating", "failed", "in_progress")


def test_an_unknown_id_answers_like_another_tenants(two) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        two["b"].batches.retrieve("batch_00000000000000000000000")
    assert "No batch found" in str(err.value)


def test_no_key_and_an_unknown_key_are_refused(api: Api) -> None:
    assert httpx.get(api.base_url + "/batches").status_code == 401
    assert httpx.get(api.base_url + "/batches", headers={"Authorization": "Basic abc"}).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        _client(api, "sk-pr-" + "x" * 43).batches.list()
    api.app.state.limiter = FailureLimiter(max_failures=5)  # the next tests start with a clean count


def test_a_revoked_key_is_refused(api: Api) -> None:
    name, key = api.tenant("iso-revoke")
    client = _client(api, key)
    assert client.batches.list().data == []
    bootstrap = load_settings().bootstrap_servers
    registry.save(bootstrap, registry.with_revoked(registry.existing(bootstrap, name), None))
    wait_until(lambda: api.app.state.registry.authenticate(key) is None, "the revocation to reach the API")
    with pytest.raises(openai.AuthenticationError):
        client.batches.list()
    api.app.state.limiter = FailureLimiter(max_failures=5)


def test_repeated_failures_are_rate_limited_even_for_a_good_key(api: Api) -> None:
    _, key = api.tenant("iso-limit")
    for _ in range(5):
        assert httpx.get(api.base_url + "/files", headers={"Authorization": "Bearer sk-pr-guess"}).status_code == 401
    refused = httpx.get(api.base_url + "/files", headers={"Authorization": f"Bearer {key}"})
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    api.app.state.limiter = FailureLimiter(max_failures=5)
    assert httpx.get(api.base_url + "/files", headers={"Authorization": f"Bearer {key}"}).status_code == 200
