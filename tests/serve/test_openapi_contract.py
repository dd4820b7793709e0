"""The OpenAPI document at /openapi.json is the server's contract (issue 39): a client generated from it is right.

schemathesis runs every check against `linearrag serve`'s routes on a real uvicorn server on 127.0.0.1 with the
small index, a scripted chat model behind /v1/answer and limits of its own, which the document must show. The
checks' settings are the repository's schemathesis.toml (the one `st run` reads, docs/serving.md "The contract"):
where a check's expectation is wrong for this API, that file says why. Bounded: a few examples an operation, in
positive and negative mode, with the coverage phase's boundary cases (~30 s on 2 busy cores).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from linearrag_torch.serve import LinearRAGService, ServeSettings, create_app  # noqa: E402
from linearrag_torch.serve.schemas import SPACES  # noqa: E402
from test_serve import TIMEOUT, running, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# limits of this server's own (not the defaults): the document must show them; small ones keep a fuzzed request
# cheap (4 questions at most, not 256)
LIMITS = dict(max_questions=4, max_question_chars=120, max_top_k=8, max_body_bytes=16384)
# Test-only settings on top of schemathesis.toml. The learned reranker costs ~0.2 s a passage on 2 busy cores:
# schemathesis draws boundary values, and one question with rerank_candidates 50 (and rerank_loop_candidates 50
# over 4 chain rounds) takes 10-50 s there. The reranker is still fuzzed (rerank true or false, null or not),
# over a few candidates; `st run` (docs/serving.md) draws the whole range.
CHEAP_RERANK = """
[dictionaries]
few_candidates = { values = [1, 2, 3] }
no_loop = { values = [0, 1] }

[parameters]
"body.rerank_candidates" = { dictionary = "few_candidates", probability = 1.0 }
"body.rerank_loop_candidates" = { dictionary = "no_loop", probability = 1.0 }
"""


def contract_config():
    """schemathesis.toml and CHEAP_RERANK (its own tables: a TOML table may appear once, so a second one fails
    loudly here)."""
    text = (ROOT / "schemathesis.toml").read_text(encoding="utf-8") + CHEAP_RERANK
    return schemathesis.Config.from_str(text, base_dir=str(ROOT))


@pytest.fixture(scope="module")
def contract_server(small_rag, small_index_dir, tmp_path_factory):
    """A served small index (reloadable from small_index_dir: /admin/reload answers 200) with LIMITS and, when
    openai is installed, a scripted chat model: its base URL and whether /v1/answer can answer 200."""
    chat = llm = None
    try:
        import openai  # noqa: F401
    except ImportError:
        pass
    else:
        from scripted_servers import ScriptedChatServer

        from linearrag_torch.answers.generation import LLM

        chat = ScriptedChatServer(lambda body: ("reply", "The passages say so.\nAnswer: Paris")).start()
        llm = LLM(chat.base_url, "scripted-model", "chat-key", cache=tmp_path_factory.mktemp("llm") / "cache.sqlite",
                  max_retries=0)
    service = LinearRAGService(small_index_dir, ServeSettings(**LIMITS), rag=small_rag, llm=llm)
    try:
        with running(create_app(service)) as url:
            wait_ready(url)
            yield url, llm is not None
    finally:
        if chat is not None:
            chat.stop()


def served_document(chat: bool = False, **limits) -> dict:
    """The OpenAPI document of a server with these settings, as create_app makes it (no index loaded), with or
    without a chat model (only with one does it offer /v1/answer)."""
    llm = None
    if chat:
        from linearrag_torch.answers.generation import LLM

        llm = LLM("http://127.0.0.1:9/v1", "scripted-model", "chat-key")
    return create_app(LinearRAGService(Path("not-loaded"), ServeSettings(**limits), llm=llm)).openapi()


def _has_openai() -> bool:
    import importlib.util

    return importlib.util.find_spec("openai") is not None


# the document, made at collection (schema.parametrize makes one test per operation; schemathesis' lazy
# from_fixture does not run on pytest 9); test_the_server_serves_the_fuzzed_document checks it is the one served
DOCUMENT = served_document(chat=_has_openai(), **LIMITS)  # the contract server has a chat model where it can
schema = schemathesis.openapi.from_dict(DOCUMENT, config=contract_config())


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_route_keeps_its_contract(case, contract_server):
    """Every check (schemathesis.toml): no 5xx (but a search's documented 504), statuses, media types, headers
    and bodies as documented, data valid by the schema accepted and invalid data refused, unknown methods 405.
    Each operation: its coverage cases (boundaries, each field missing or of another type) and 8 drawn ones, in
    positive and negative mode."""
    url, _ = contract_server
    case.call_and_validate(base_url=url, timeout=TIMEOUT)


def test_the_server_serves_the_fuzzed_document(contract_server):
    url, _ = contract_server
    assert httpx.get(url + "/openapi.json", timeout=TIMEOUT).json() == json.loads(json.dumps(DOCUMENT))


def test_the_document_states_the_rule_the_limits_and_the_media_types():
    """What the fuzzing relies on, said directly: the body's exactly-one rule, this server's limits, every status
    of the search routes, Retry-After on a 429, the metrics' text media type."""
    doc = DOCUMENT
    search = doc["paths"]["/v1/search"]["post"]
    body = search["requestBody"]["content"]["application/json"]["schema"]
    assert body["oneOf"] == [{"required": ["question"]}, {"required": ["questions"]}]
    assert body["additionalProperties"] is False
    props = body["properties"]
    assert props["question"]["maxLength"] == props["questions"]["items"]["maxLength"] == LIMITS["max_question_chars"]
    assert props["questions"]["maxItems"] == LIMITS["max_questions"]
    assert {"type": "integer", "minimum": 1, "maximum": LIMITS["max_top_k"]} in props["top_k"]["anyOf"]
    assert str(LIMITS["max_body_bytes"]) in search["requestBody"]["description"]
    assert set(search["responses"]) == {"200", "408", "413", "422", "429", "500", "503", "504"}
    answer = served_document(chat=True, **LIMITS)["paths"]["/v1/answer"]["post"]
    assert set(answer["responses"]) == set(search["responses"]) | {"502"}
    assert "/v1/answer" not in served_document(**LIMITS)["paths"]  # no chat model, no route (issue 47)
    assert search["responses"]["429"]["headers"]["Retry-After"]["required"] is True
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert str(LIMITS["max_body_bytes"]) in search["responses"]["413"]["description"]


def test_every_setting_with_choices_is_an_enum():
    """A retrieval setting whose values are a fixed set (mode, question_ner, reranker_precision) is an enum of that
    set in the body's schema: a client generated from the document can send nothing the server refuses."""
    from dataclasses import fields

    from linearrag_torch.config import RetrievalConfig
    from linearrag_torch.serve.schemas import SERVER_ONLY_SETTINGS

    props = DOCUMENT["paths"]["/v1/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    with_choices = {f.name: list(f.metadata["choices"]) for f in fields(RetrievalConfig)
                    if f.metadata.get("choices") and f.name not in SERVER_ONLY_SETTINGS}
    assert not set(SERVER_ONLY_SETTINGS) & set(props)  # the operator's settings are not in a request's schema
    assert {"mode", "question_ner", "reranker_precision"} <= set(with_choices)
    for name, choices in with_choices.items():
        enums = [alt["enum"] for alt in props[name]["anyOf"] if "enum" in alt]
        assert enums == [choices], name


def test_the_blank_question_pattern_is_what_strip_removes():
    """The schema's "not blank" pattern spells out the characters str.strip() removes (regex engines disagree
    on \\s), so that the schema refuses exactly the questions the server calls blank."""
    assert SPACES == "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())


def test_with_an_api_key_the_document_declares_bearer_security_and_401(small_rag):
    """The routes behind the key declare HTTP bearer security and their 401 (with WWW-Authenticate); /health
    needs no key."""
    from fastapi.testclient import TestClient

    from linearrag_torch.answers.generation import LLM

    service = LinearRAGService(None, ServeSettings(api_key="s3cret"), rag=small_rag,
                               llm=LLM("http://127.0.0.1:9/v1", "scripted-model", "chat-key"))
    doc = create_app(service).openapi()
    assert doc["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer", "description": "the server's --api-key"}
    for path, method in [("/v1/search", "post"), ("/v1/answer", "post"), ("/info", "get"), ("/metrics", "get"),
                         ("/admin/reload", "post")]:
        op = doc["paths"][path][method]
        assert op["security"] == [{"HTTPBearer": []}], path
        assert op["responses"]["401"]["headers"]["WWW-Authenticate"]["required"] is True, path
    assert "security" not in doc["paths"]["/health"]["get"] and "401" not in doc["paths"]["/health"]["get"]["responses"]
    with TestClient(create_app(service)) as client:  # and the key is what the server asks for
        assert client.get("/info").status_code == 401
        assert client.get("/info", headers={"Authorization": "Bearer s3cret"}).status_code == 200
