"""``kvembed serve`` keeps its own contract: schemathesis, every check, fuzzes a real server (a
process on a socket, as in tests/test_serve.py) from the server's own ``/openapi.json``, with a
fixed seed and a bounded number of examples per operation.

Every operation runs schemathesis' coverage phase (boundary values, schema-violating bodies,
undeclared methods: 405 with ``Allow``, missing headers) and its fuzzing phase (``MAX_EXAMPLES``
generated bodies). Each response must be declared (status, content type, headers, body schema);
no 5xx. Every check runs (``--checks all``) at schemathesis' own settings: the document names each
loaded model's outputs, widest ``dimensions`` and token ids, so a request it allows is answered 2xx
and one it forbids 4xx with no allowance made for this server.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events
from kvembed.bench.served import ServerProcess

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: fuzzing examples per operation (the coverage phase adds its own cases): enough to find the
#: failures this file was written for over twelve operations, few enough for under a minute on a
#: 2-core host
MAX_EXAMPLES = 15
SEED = 34

#: ``schemathesis run --checks all --seed SEED --max-examples MAX_EXAMPLES``: every check, each at its
#: default expected statuses; a request may take long on a loaded host (2048 inputs), hence the timeout
CONFIG = {
    "seed": SEED,
    "generation": {"max-examples": MAX_EXAMPLES},
    "checks": {"enabled": True},
    "request-timeout": 60,
}

@pytest.fixture(scope="module")
def contract_server(stories_artifact, tmp_path_factory):
    """The demo model as a prompt method (kv) and a raw-text method (va, token ids allowed)."""
    args = [f"kv={stories_artifact('kv-embedding')}", f"va={stories_artifact('va', layers='1-2')}"]
    process = ServerProcess(args, tmp_path_factory.mktemp("serve-contract") / "server.log")
    yield process.wait_healthy()
    process.stop()


def test_the_server_keeps_its_openapi_contract(contract_server):
    """schemathesis' own engine (what ``schemathesis run --checks all`` drives: examples, coverage and
    fuzzing phases), not its pytest plugin, whose lazy loader does not run under pytest 9."""
    schema = schemathesis.openapi.from_url(f"{contract_server.url}/openapi.json", config=SchemathesisConfig.from_dict(CONFIG))
    cases: Counter[str] = Counter()
    checks: Counter[str] = Counter()
    failures: list[str] = []
    errors: list[str] = []
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, (events.ScenarioFinished, events.FuzzScenarioFinished)):
            recorder = event.recorder
            for case_id, node in recorder.cases.items():
                cases[node.value.operation.label] += 1
                for check in recorder.checks.get(case_id, []):
                    checks[check.name] += 1
                    if check.status != Status.SUCCESS and check.failure_info is not None:
                        failures.append(f"{node.value.operation.label}: {check.name}: {check.failure_info.failure.title}\n"
                                        f"{check.failure_info.failure.message}\n{check.failure_info.code_sample}")
                    elif check.status == Status.ERROR:
                        errors.append(f"{node.value.operation.label}: {check.name} errored")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            errors.append(f"{type(event).__name__}: {getattr(event, 'label', '')}: {getattr(event, 'value', event)!r}")
        elif isinstance(event, events.Interrupted):
            errors.append("interrupted")
    print(f"\nschemathesis (seed {SEED}, {MAX_EXAMPLES} fuzzing examples per operation): {sum(cases.values())} cases "
          f"{dict(cases)}, checks run {dict(checks)}, {len(failures)} failures, {len(errors)} errors")
    assert not errors, "\n\n".join(errors)
    assert not failures, "\n\n".join(dict.fromkeys(failures))  # the same failure, once
    operations = {"POST /v1/embeddings", "POST /embeddings", "GET /v1/models", "GET /health", "GET /metrics",
                  "POST /embed", "POST /", "POST /tokenize", "POST /decode", "GET /info", "POST /v2/embed", "POST /v2/rerank"}
    assert set(cases) == operations, cases
    assert all(cases[op] >= MAX_EXAMPLES for op in operations if op.startswith("POST")), cases
    assert checks["not_a_server_error"] and checks["response_schema_conformance"] and checks["unsupported_method"], checks


def test_the_document_declares_every_response(contract_server):
    """The statuses, bodies and content types the server really answers with are in the document,
    each dialect's error body its own."""
    document = httpx.get(f"{contract_server.url}/openapi.json", timeout=10).json()
    paths = document["paths"]
    bodies = {"/v1/embeddings": "ErrorBody", "/embeddings": "ErrorBody", "/embed": "TeiError", "/": "TeiError",
              "/tokenize": "TeiError", "/decode": "TeiError", "/v2/embed": "CohereError", "/v2/rerank": "CohereError"}
    for path, body in bodies.items():
        responses = paths[path]["post"]["responses"]
        assert set(responses) == {"200", "400", "401", "404", "408", "413", "422", "429", "500", "503", "504"}, path
        for status in set(responses) - {"200"}:
            assert responses[status]["content"] == {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}}, status
    assert set(paths["/v1/models"]["get"]["responses"]) == {"200", "401", "503"}
    assert set(paths["/info"]["get"]["responses"]) == {"200", "401", "503"}
    assert set(paths["/health"]["get"]["responses"]) == {"200", "503"}
    metrics = httpx.get(f"{contract_server.url}/metrics", timeout=10)
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == [metrics.headers["content-type"]]
    assert set(document["components"]["schemas"]["ErrorDetail"]["required"]) == {"message", "type", "param", "code"}
    assert set(document["components"]["schemas"]["TeiError"]["required"]) == {"error", "error_type"}
    assert set(document["components"]["schemas"]["CohereError"]["required"]) == {"message"}
    request = paths["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    enum = lambda props, name: tuple(props.get(name, {}).get("enum", ()))  # noqa: E731
    variants: dict[tuple, list[dict]] = {}
    for v in request["anyOf"]:
        props = v["properties"]
        variants.setdefault((props["model"]["const"], enum(props, "truncate"), enum(props, "windows")), []).append(props)
    # va takes token ids: a row over the cap is cut (truncate), windowed, or refused (neither: rows bounded)
    assert set(variants) == {("kv", (), ()), ("va", (True,), ()), ("va", (), (True,)), ("va", (False, None), (False, None))}
    models = httpx.get(f"{contract_server.url}/v1/models", timeout=10).json()["data"]
    cap = next(card["max_input_tokens"] for card in models if card["id"] == "va")
    for (name, truncate, windows), group in variants.items():
        card = next(card for card in models if card["id"] == name)
        assert len(group) == 2  # int8/uint8 at full width, or any width without them
        full, narrow = sorted(group, key=lambda props: len(props["embedding_types"]["anyOf"][0]["enum"]), reverse=True)
        assert full["dimensions"]["anyOf"][0]["minimum"] == card["dim"] and narrow["dimensions"]["anyOf"][0]["minimum"] == 1
        assert full["embedding_types"]["anyOf"][0]["enum"] == ["float", "int8", "uint8", "binary", "ubinary"]
        assert narrow["embedding_types"]["anyOf"][0]["enum"] == ["float", "binary", "ubinary"]
        for props in group:
            assert props["output"]["enum"] == [None, *card["outputs"]]
            assert props["dimensions"]["anyOf"][0]["maximum"] == card["dim"]
            forms = props["input"]["anyOf"]
            if name == "kv":
                assert [form.get("items", {}) for form in forms] == [{}, {"type": "string"}]  # a prompt method takes no token ids
            else:
                assert forms[2]["items"]["maximum"] > 0
                assert forms[2].get("maxItems") == (cap if (truncate, windows) == ((False, None), (False, None)) else None)


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("DELETE", "/v1/embeddings", "POST"), ("GET", "/embeddings", "POST"), ("POST", "/v1/models", "GET"),
    ("PUT", "/health", "GET"), ("PATCH", "/metrics", "GET"),
])
def test_405_names_the_allowed_methods(contract_server, method, path, allow):
    response = httpx.request(method, f"{contract_server.url}{path}", timeout=10)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_an_integral_float_is_an_integer(contract_server):
    """JSON Schema's ``integer`` includes 8.0, so ``dimensions: 8.0`` is accepted as 8 (and a token id
    5.0 as 5); 8.5 is not."""
    url = f"{contract_server.url}/v1/embeddings"
    whole = httpx.post(url, json={"model": "kv", "input": "a cat", "dimensions": 8.0}, timeout=30)
    assert whole.status_code == 200, whole.text
    assert len(whole.json()["data"][0]["embedding"]) == 8
    half = httpx.post(url, json={"model": "kv", "input": "a cat", "dimensions": 8.5}, timeout=30)
    assert half.status_code == 422 and half.json()["error"]["param"] == "dimensions"
    ids = httpx.post(url, json={"model": "va", "input": [5, 7]}, timeout=30)
    floats = httpx.post(url, json={"model": "va", "input": [5.0, 7]}, timeout=30)  # token ids too
    assert ids.status_code == floats.status_code == 200, floats.text
    assert ids.json()["data"] == floats.json()["data"]
    assert httpx.post(url, json={"model": "va", "input": [5.5, 7]}, timeout=30).status_code == 400
