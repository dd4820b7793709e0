"""What a server user meets first: /docs and /redoc work without internet (their assets are served by the
server), and a 422 names the field without sending a long input back."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("fastapi_offline")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from linearrag_torch.serve import LinearRAGService, ServeSettings, create_app  # noqa: E402
from linearrag_torch.serve.app import DOC_ASSETS  # noqa: E402


@pytest.fixture(scope="module")
def client(small_rag):
    service = LinearRAGService(None, ServeSettings(max_questions=5, max_question_chars=200), rag=small_rag)
    with TestClient(create_app(service)) as c:  # runs the lifespan: the service loads and warms up
        deadline = time.monotonic() + 120  # in the background: searches are 503 until /health says ok
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline, c.get("/health").text
            time.sleep(0.05)
        yield c


@pytest.mark.parametrize("page, assets", [("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")),
                                          ("/redoc", ("redoc.standalone.js",))])
def test_doc_pages_load_their_assets_from_the_server(client, page, assets):
    r = client.get(page)
    assert r.status_code == 200
    assert "cdn." not in r.text and "fonts.googleapis" not in r.text, r.text
    for name in assets:
        assert f"{DOC_ASSETS}/{name}" in r.text
        asset = client.get(f"{DOC_ASSETS}/{name}")
        assert asset.status_code == 200 and len(asset.content) > 10_000
    assert client.get("/openapi.json").json()["paths"]["/v1/search"]


def test_a_422_names_the_field_and_cuts_the_echo(client):
    long_question = "Who? " * 480  # 2,400 characters, over max_question_chars
    r = client.post("/v1/search", json={"question": long_question})
    assert r.status_code == 422
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "question"] and "200" in err["msg"]
    assert len(r.text) < 600, r.text
    assert err["input"].endswith("(2400 characters)")
    r = client.post("/v1/search", json={"questions": ["Where did Sylvia Burka's husband die?"] * 300})
    assert r.status_code == 422
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "questions"] and err["input"] == "(a list of 300 items)"
    assert len(r.text) < 600, r.text
