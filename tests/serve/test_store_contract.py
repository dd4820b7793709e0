"""The store's OpenAPI document is its contract too (issue 51): schemathesis runs every check (schemathesis.toml)
against the store's routes (indexes by name, writes, the admin API, the server's own) on a real uvicorn server on
127.0.0.1 serving two small indexes. The index name in a path is drawn from the names served and a few others, so
that the routes are fuzzed on real indexes and on missing ones; writes land in copies. Bounded as the
single-index contract test is (a few examples an operation)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from linearrag_torch.serve import ServeSettings  # noqa: E402
from linearrag_torch.serve.store import Store  # noqa: E402
from linearrag_torch.serve.store_app import create_store_app  # noqa: E402
from test_openapi_contract import CHEAP_RERANK, LIMITS, ROOT  # noqa: E402
from test_serve import TIMEOUT, copy_index, running  # noqa: E402
from test_store import wait_store  # noqa: E402

STORE_LIMITS = {**LIMITS, "max_write_passages": 3, "max_passage_chars": 200, "max_indexes": 4, "mcp": False}
NAMES = """
[dictionaries]
index_names = { values = ["alpha", "beta", "nope"] }
"""


def contract_config():
    text = (ROOT / "schemathesis.toml").read_text(encoding="utf-8") + CHEAP_RERANK.replace(
        "[dictionaries]\n", NAMES.strip() + "\n") + '"path.name" = { dictionary = "index_names", probability = 0.8 }\n'
    return schemathesis.Config.from_str(text, base_dir=str(ROOT))


def store_document() -> dict:
    """The document of a store of two indexes, as create_store_app makes it (nothing loaded)."""
    return create_store_app(Store([], ServeSettings(**STORE_LIMITS)), mcp=False).openapi()


@pytest.fixture(scope="module")
def store_server(small_rag, small_index_dir, tmp_path_factory):
    """alpha (given on the command line: it cannot be dropped) and beta (in the store's folder, where created
    indexes go)."""
    base = tmp_path_factory.mktemp("store")
    alpha = copy_index(small_index_dir, base / "alpha")
    (base / "root").mkdir()
    copy_index(small_index_dir, base / "root" / "beta")
    store = Store([alpha, base / "root"], ServeSettings(**STORE_LIMITS), models=small_rag)
    with running(create_store_app(store)) as url:
        wait_store(url)
        yield url


DOCUMENT = store_document()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=contract_config())


@schema.parametrize()
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_store_route_keeps_its_contract(case, store_server):
    """Every check, every route of the store: statuses, media types, headers and bodies as documented, valid data
    accepted (or refused for a documented state: 404, 409), invalid data refused with 422, no 5xx."""
    case.call_and_validate(base_url=store_server, timeout=TIMEOUT)


def test_the_store_document_covers_the_new_routes():
    paths = DOCUMENT["paths"]
    for path, method in [("/v1/indexes", "get"), ("/v1/indexes", "post"), ("/v1/indexes/{name}", "get"),
                         ("/v1/indexes/{name}", "delete"), ("/v1/indexes/{name}/search", "post"),
                         ("/v1/indexes/{name}/explain", "post"), ("/v1/indexes/{name}/passages", "post"),
                         ("/v1/indexes/{name}/passages/delete", "post"), ("/v1/indexes/{name}/load", "post"),
                         ("/v1/indexes/{name}/unload", "post"), ("/health", "get"), ("/info", "get"),
                         ("/metrics", "get")]:
        assert method in paths[path], (path, method)
    add = paths["/v1/indexes/{name}/passages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    passage = add["$defs"]["PassageIn"] if "$defs" in add else None
    assert add["properties"]["passages"]["maxItems"] == STORE_LIMITS["max_write_passages"]
    assert passage is None or passage["properties"]["text"]["maxLength"] == STORE_LIMITS["max_passage_chars"]
    assert set(paths["/v1/indexes/{name}/passages"]["post"]["responses"]) >= {"200", "403", "404", "409", "413",
                                                                              "422", "429"}
    assert json.dumps(DOCUMENT).count("alpha") == 0  # the document names no index
