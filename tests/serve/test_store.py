"""The server as a store (issue 51), on real uvicorn servers on 127.0.0.1: indexes by name with shared models,
passages added and deleted over HTTP (checked against LinearRAG.add / delete in this process and against the
folder on disk), the admin API, and keys by index and role (the table of every route x role x scope)."""
import json
import threading
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from linearrag_torch import LinearRAG, TriGraphIndex  # noqa: E402
from linearrag_torch.serve import ServeSettings  # noqa: E402
from linearrag_torch.serve.keys import Keys, hash_key  # noqa: E402
from linearrag_torch.serve.store import Store  # noqa: E402
from linearrag_torch.serve.store_app import create_store_app  # noqa: E402

from test_serve import TIMEOUT, copy_index, running  # noqa: E402
from test_writes_under_load import NEW_A, NEW_B, OWN_QUESTIONS  # noqa: E402

BETA_DROPPED = 20  # beta: the small index less its last passages (two different indexes)


def wait_store(url, headers=None):
    import time

    deadline = time.monotonic() + TIMEOUT
    while httpx.get(url + "/health").status_code != 200:
        assert time.monotonic() < deadline, "the store did not load"
        time.sleep(0.05)


def make_root(small_rag, small_index_dir, root: Path) -> tuple:
    """ROOT/alpha (the small index) and ROOT/beta (without its last BETA_DROPPED passages); their LinearRAGs."""
    root.mkdir()
    copy_index(small_index_dir, root / "alpha")
    beta = LinearRAG(TriGraphIndex.load(small_index_dir), "cpu").share_models_from(small_rag)
    beta.delete(list(beta.index.passage_ids[-BETA_DROPPED:])).save(root / "beta")
    return small_rag, beta


def hits_of(rag, questions, top_k=5):
    return [[h.id for h in hs] for hs in rag.search(questions, top_k=top_k)]


def ids_of(resp):
    assert resp.status_code == 200, resp.text
    return [[h["id"] for h in r["hits"]] for r in resp.json()["results"]]


class Served:
    """A store served in a thread: ``url``, ``store``."""

    def __init__(self, paths, keys=None, models=None, **settings):
        self.store = Store(paths, ServeSettings(**{"mcp": False, **settings}), keys=keys, models=models)
        self._cm = running(create_store_app(self.store))

    def __enter__(self):
        self.url = self._cm.__enter__()
        wait_store(self.url)
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


@pytest.fixture
def root(small_rag, small_index_dir, tmp_path):
    alpha, beta = make_root(small_rag, small_index_dir, tmp_path / "root")
    return tmp_path / "root", alpha, beta


# ------------------------------------------------------------------------------------------ indexes by name
def test_indexes_by_name_answer_each_as_its_own_index_with_the_models_loaded_once(root, small_questions, small_rag):
    folder, alpha, beta = root
    qs = [q["question"] for q in small_questions]
    batches = []
    with Served([folder], models=small_rag) as srv:
        srv.store.batcher.on_batch = (lambda f: lambda st: (batches.append((st.key[0], st.size)), f(st)))(
            srv.store.batcher.on_batch)
        listing = httpx.get(srv.url + "/v1/indexes").json()["indexes"]
        assert [(x["name"], x["status"], x["counts"]["passages"]) for x in listing] == [
            ("alpha", "ready", alpha.index.num_passages), ("beta", "ready", beta.index.num_passages - 0)]
        # both indexes at once: each answers as its own index does in this process
        with httpx.Client(timeout=TIMEOUT) as c:
            results = {}

            def ask(name):
                results[name] = ids_of(c.post(f"{srv.url}/v1/indexes/{name}/search", json={"questions": qs}))

            threads = [threading.Thread(target=ask, args=(n,)) for n in ("alpha", "beta")]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
        assert results["alpha"] == hits_of(alpha, qs) and results["beta"] == hits_of(beta, qs)
        assert results["alpha"] != results["beta"]
        a, b = srv.store.hosts["alpha"].rag, srv.store.hosts["beta"].rag
        assert a.encoder is b.encoder and a.nlp is b.nlp  # loaded once
        assert {name for name, _ in batches} == {"alpha", "beta"}  # each batch one index's (its key's first part)
        r = httpx.post(srv.url + "/v1/indexes/gamma/search", json={"question": "x"})
        assert r.status_code == 404 and "gamma" in r.json()["detail"]
        assert httpx.post(srv.url + "/v1/search", json={"question": "x"}).status_code == 404  # two: no single form
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'linearrag_questions_total{index="alpha"}' in metrics and 'index="beta"' in metrics


def test_one_index_as_a_store_keeps_todays_routes(small_rag, small_index_dir, small_questions, tmp_path):
    folder = copy_index(small_index_dir, tmp_path / "solo")
    qs = [q["question"] for q in small_questions[:3]]
    with Served([folder], models=small_rag) as srv:
        assert ids_of(httpx.post(srv.url + "/v1/search", json={"questions": qs}, timeout=TIMEOUT)) == \
            hits_of(small_rag, qs) == ids_of(httpx.post(srv.url + "/v1/indexes/solo/search", json={"questions": qs},
                                                        timeout=TIMEOUT))
        # explain, in both forms, with the request's settings (they were not passed on before the page needed them)
        body = {"question": qs[0], "top_k": 3, "mode": "paper", "delta": 0.3}
        want = [h.id for h, _ in small_rag.explain(qs[0], top_k=3, mode="paper", delta=0.3)[0]["hits"]]
        assert want != [h.id for h, _ in small_rag.explain(qs[0], top_k=3)[0]["hits"]]
        for path in ("/v1/explain", "/v1/indexes/solo/explain"):
            r = httpx.post(srv.url + path, json=body, timeout=TIMEOUT)
            assert [h["id"] for h in r.json()["results"][0]["hits"]] == want, path
        r = httpx.post(srv.url + "/admin/reload", timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["status"] == "ready"


# ------------------------------------------------------------------------------------------ writes
def test_writes_over_http_equal_the_library_and_are_on_disk(root, small_rag, tmp_path):
    folder, alpha, _ = root
    want = LinearRAG(TriGraphIndex.load(folder / "alpha"), "cpu").share_models_from(small_rag).add(NEW_A + NEW_B)
    with Served([folder], models=small_rag) as srv, httpx.Client(timeout=TIMEOUT) as c:
        base = srv.url + "/v1/indexes/alpha"
        # concurrent writers to one index are serialised, none lost
        bodies = [{"passages": [p]} for p in NEW_A + NEW_B]
        statuses = []

        def write(body):
            statuses.append(c.post(base + "/passages", json=body).status_code)

        threads = [threading.Thread(target=write, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert statuses == [200] * 3
        on_disk = TriGraphIndex.load(folder / "alpha", verify=True)  # acknowledged: on disk, whole
        assert sorted(map(str, on_disk.passage_ids)) == sorted(map(str, want.index.passage_ids))
        # the served index answers as the library's add of the same passages (ids order aside: the writes raced)
        got = ids_of(c.post(base + "/search", json={"questions": OWN_QUESTIONS}))
        assert [set(x) for x in got] == [set(x) for x in hits_of(want, OWN_QUESTIONS)]
        assert got[0][0] == "load-a1" and got[2][0] == "load-b1"
        fingerprint = (folder / "alpha" / "index.json").read_bytes()
        # bad input: 422 naming the field, nothing written
        # (ids that conflict, which no schema can say: 409; the rest 422)
        bad = [({"passages": [{"id": "n1", "text": " "}]}, ["body", "passages", 0, "text"], 422),
               ({"passages": [{"id": "n1", "text": "a"}, {"id": "n1", "text": "b"}]}, ["body", "passages", 1, "id"],
                409),
               ({"passages": [{"id": 7, "text": "a"}, {"id": "7", "text": "b"}]}, ["body", "passages", 1, "id"], 409),
               ({"passages": [{"id": "load-a1", "text": "again"}]}, ["body", "passages"], 409),
               ({"passages": [{"id": "n2", "text": "x" * 20001}]}, ["body", "passages", 0, "text"], 422),
               ({"passages": []}, ["body", "passages"], 422),
               ({"passages": [{"id": True, "text": "a"}]}, ["body", "passages", 0, "id"], 422),
               ({"passages": [{"id": "n3", "text": "a\ud800"}]}, ["body", "passages", 0, "text"], 422),
               ({"passages": [{"text": "a", "colour": "red"}]}, ["body", "passages", 0, "colour"], 422)]
        for body, loc, status in bad:
            r = c.post(base + "/passages", content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code == status, (body, r.text)
            assert any(e["loc"][:len(loc)] == loc for e in r.json()["detail"]), (loc, r.json())
        r = c.post(base + "/passages", content=b'{"passages": [', headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
        r = c.post(base + "/passages/delete", json={"ids": ["load-a1", "no-such-id"]})
        assert r.status_code == 409 and r.json()["detail"][0]["loc"] == ["body", "ids", 1]
        assert "no-such-id" in r.json()["detail"][0]["msg"]
        assert (folder / "alpha" / "index.json").read_bytes() == fingerprint  # nothing written
        # delete: back to the index before the writes
        r = c.post(base + "/passages/delete", json={"ids": [p["id"] for p in NEW_A + NEW_B]})
        assert r.status_code == 200 and r.json()["counts"]["passages"] == alpha.index.num_passages
        qs = OWN_QUESTIONS
        assert ids_of(c.post(base + "/search", json={"questions": qs})) == hits_of(alpha, qs)
        assert TriGraphIndex.load(folder / "alpha", verify=True).passage_ids == alpha.index.passage_ids


# ------------------------------------------------------------------------------------------ admin
def test_the_ner_worker_processes_are_the_stores_not_the_first_indexs(root, small_rag, small_questions):
    """--ner-processes in a store: one set of NER worker processes shared by the indexes of one spaCy model.
    Unloading the index that started them leaves them running for the others (they answer as before, through the
    workers); unloading the last index that uses them stops them (their processes gone)."""
    folder, alpha, beta = root
    qs = [q["question"] for q in small_questions] * 4  # >= 16 questions: the batch goes to the workers
    assert len(qs) >= 16
    with Served([folder], models=small_rag, ner_processes=2) as srv, httpx.Client(timeout=TIMEOUT) as c:
        a, b = srv.store.hosts["alpha"].rag, srv.store.hosts["beta"].rag
        pool = a.ner_pool
        assert pool is not None and pool.running and b.ner_pool is pool  # one set, shared
        pids = list(pool._pool._processes)
        assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)
        assert c.post(srv.url + "/v1/indexes/alpha/unload").json()["status"] == "unloaded"
        assert pool.running and b.ner_pool is pool  # beta keeps them
        assert ids_of(c.post(srv.url + "/v1/indexes/beta/search", json={"questions": qs})) == hits_of(beta, qs)
        assert pool.running and pool.restarts == 0
        assert c.post(srv.url + "/v1/indexes/alpha/load").json()["status"] == "ready"  # back: shares them again
        assert srv.store.hosts["alpha"].rag.ner_pool is pool
        assert ids_of(c.post(srv.url + "/v1/indexes/alpha/search", json={"questions": qs})) == hits_of(alpha, qs)
        for name in ("alpha", "beta"):
            assert c.post(f"{srv.url}/v1/indexes/{name}/unload").json()["status"] == "unloaded"
        assert not pool.running  # the last index that used them: stopped
        assert not any(Path(f"/proc/{pid}").exists() for pid in pids)


def test_create_load_unload_drop(root, small_rag):
    folder, _, _ = root
    with Served([folder], models=small_rag) as srv, httpx.Client(timeout=TIMEOUT) as c:
        r = c.post(srv.url + "/v1/indexes", json={"name": "gamma"})
        assert r.status_code == 201 and r.json()["counts"]["passages"] == 0, r.text
        assert c.post(srv.url + "/v1/indexes", json={"name": "gamma"}).status_code == 409
        assert c.post(srv.url + "/v1/indexes", json={"name": "../evil"}).status_code == 422
        base = srv.url + "/v1/indexes/gamma"
        assert ids_of(c.post(base + "/search", json={"question": "Who directed Blue River?"})) == [[]]
        r = c.post(base + "/passages", json={"passages": NEW_A})
        assert r.status_code == 200, r.text
        assert ids_of(c.post(base + "/search", json={"question": OWN_QUESTIONS[0], "top_k": 1})) == [["load-a1"]]
        assert srv.store.hosts["gamma"].rag.encoder is srv.store.hosts["alpha"].rag.encoder
        r = c.post(base + "/explain", json={"question": OWN_QUESTIONS[0], "top_k": 1})
        assert r.status_code == 200 and r.json()["results"][0]["hits"][0]["id"] == "load-a1"
        assert c.post(base + "/unload").json()["status"] == "unloaded"
        assert srv.store.hosts["gamma"].rag is None
        assert c.post(base + "/search", json={"question": "x"}).status_code == 409
        assert c.post(base + "/load").json()["status"] == "ready"
        assert ids_of(c.post(base + "/search", json={"question": OWN_QUESTIONS[0], "top_k": 1})) == [["load-a1"]]
        assert c.delete(base).json()["status"] == "dropped"
        assert not (folder / "gamma").exists()
        assert c.post(base + "/search", json={"question": "x"}).status_code == 404
        assert [x["name"] for x in c.get(srv.url + "/v1/indexes").json()["indexes"]] == ["alpha", "beta"]


# ------------------------------------------------------------------------------------------ keys
KEYS = {"read-a": ("read", ["alpha"]), "write-a": ("write", ["alpha"]), "admin-a": ("admin", ["alpha"]),
        "admin-all": ("admin", "*")}

# route -> the status each key gets on index alpha (in scope for every key here) and on beta (out of scope but for
# admin-all); None: no key. A create is checked on its own below.
TABLE = {
    # (method, path, JSON body): {key: (status on alpha, status on beta)}
    ("POST", "search", '{"question": "Who directed Blue River?"}'):
        {None: (401, 401), "read-a": (200, 404), "write-a": (200, 404), "admin-a": (200, 404), "admin-all": (200, 200)},
    ("POST", "explain", '{"question": "Who directed Blue River?", "top_k": 1}'):
        {None: (401, 401), "read-a": (200, 404), "write-a": (200, 404), "admin-a": (200, 404), "admin-all": (200, 200)},
    ("GET", "", None):
        {None: (401, 401), "read-a": (200, 404), "write-a": (200, 404), "admin-a": (200, 404), "admin-all": (200, 200)},
    ("POST", "passages", '{"passages": [{"text": "   "}]}'):  # (blank: 422 once allowed, nothing written)
        {None: (401, 401), "read-a": (403, 404), "write-a": (422, 404), "admin-a": (422, 404), "admin-all": (422, 422)},
    ("POST", "passages/delete", '{"ids": ["no-such-id"]}'):  # (an id not in the index: 409 once allowed)
        {None: (401, 401), "read-a": (403, 404), "write-a": (409, 404), "admin-a": (409, 404), "admin-all": (409, 409)},
    ("POST", "load", None):
        {None: (401, 401), "read-a": (403, 404), "write-a": (403, 404), "admin-a": (200, 404), "admin-all": (200, 200)},
    ("POST", "unload", None):  # then loaded again by the next row's admin keys
        {None: (401, 401), "read-a": (403, 404), "write-a": (403, 404), "admin-a": (200, 404), "admin-all": (200, 200)},
    ("DELETE", "", None):  # (the admin keys drop an index below)
        {None: (401, 401), "read-a": (403, 404), "write-a": (403, 404)},
}


def test_keys_by_index_and_role_table(root, tmp_path, small_rag):
    folder, _, _ = root
    secrets = {name: f"key-{name}-0123456789" for name in KEYS}
    (tmp_path / "keys.json").write_text(json.dumps({"keys": [
        {"name": n, "sha256": hash_key(secrets[n]), "role": role, "indexes": scope}
        for n, (role, scope) in KEYS.items()]}))
    keys = Keys.load(tmp_path / "keys.json", api_key="single-key")

    def h(name):
        return {} if name is None else {"Authorization": f"Bearer {secrets[name] if name in secrets else name}"}

    with Served([folder], keys=keys, models=small_rag) as srv, httpx.Client(timeout=TIMEOUT) as c:
        got = {}
        for (method, route, body), want in TABLE.items():
            for key, statuses in want.items():
                for index, expect in zip(("alpha", "beta"), statuses):
                    url = f"{srv.url}/v1/indexes/{index}" + (f"/{route}" if route else "")
                    r = c.request(method, url, json=body and json.loads(body), headers=h(key))
                    got[(method, route, key, index)] = r.status_code
                    if route == "unload" and r.status_code == 200:
                        assert c.post(f"{srv.url}/v1/indexes/{index}/load", headers=h("admin-all")).status_code == 200
                    assert r.status_code == expect, (method, route, key, index, r.text)
        # the server's own routes: what each key sees
        for key in (None, "read-a", "admin-a", "admin-all", "single-key", "wrong"):
            listing = c.get(srv.url + "/v1/indexes", headers=h(key))
            info, metrics = c.get(srv.url + "/info", headers=h(key)), c.get(srv.url + "/metrics", headers=h(key))
            if key in (None, "wrong"):
                assert listing.status_code == info.status_code == metrics.status_code == 401
                assert listing.headers["www-authenticate"] == "Bearer"
                continue
            names = [x["name"] for x in listing.json()["indexes"]]
            everything = key in ("admin-all", "single-key")
            assert names == (["alpha", "beta"] if everything else ["alpha"])
            assert sorted(info.json()["indexes"]) == names
            assert ("beta" in metrics.text) == everything and ("beta" in info.text) == everything
        assert c.get(srv.url + "/health").status_code == 200  # no key needed, names nothing
        # create: admin only, and only a name in its scope
        for key, expect in (("read-a", 403), ("write-a", 403), ("admin-a", 403), ("admin-all", 201),
                            ("single-key", 409)):
            r = c.post(srv.url + "/v1/indexes", json={"name": "delta"}, headers=h(key))
            assert r.status_code == expect, (key, r.text)
        # drop: admin in scope; the single --api-key is an admin over every index
        r = c.delete(srv.url + "/v1/indexes/delta", headers=h("admin-a"))
        assert r.status_code == 404
        assert c.delete(srv.url + "/v1/indexes/delta", headers=h("single-key")).status_code == 200
        assert c.post(srv.url + "/v1/indexes/beta/search", json={"question": "x"},
                      headers=h("single-key")).status_code == 200


def test_a_keys_file_names_its_mistakes(tmp_path):
    f = tmp_path / "keys.json"
    for content, words in ((b"{", "not valid JSON"), (b'{"keys": [{"sha256": "x", "role": "read", "indexes": "*"}]}',
                                                       "keys[0].sha256"),
                           (json.dumps({"keys": [{"sha256": "a" * 64, "role": "boss", "indexes": "*"}]}).encode(),
                            "keys[0].role"),
                           (json.dumps({"keys": [{"sha256": "a" * 64, "role": "read", "indexes": "alpha"}]}).encode(),
                            "keys[0].indexes")):
        f.write_bytes(content)
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            Keys.load(f)


def test_a_passage_id_is_an_integer_as_json_schema_says_or_a_string():
    """JSON Schema's integer is any number without a fraction: -3629.0 is the id -3629 (schemathesis sends such);
    1.5, true and "" are refused."""
    from pydantic import ValidationError

    from linearrag_torch.serve.store_schemas import write_models

    add, delete, _ = write_models(ServeSettings(**{"max_write_passages": 3}))
    assert delete.model_validate({"ids": ["x", -1099511627775.0, 7]}).ids == ["x", -1099511627775, 7]
    assert add.model_validate({"passages": [{"text": "a", "id": -3629.0}]}).passages[0].id == -3629
    for bad in (1.5, True, "", 2.0 ** 64):
        with pytest.raises(ValidationError):
            delete.model_validate({"ids": [bad]})


# ------------------------------------------------------------------------------ what a newcomer trips on (issue 60)
def test_a_subfolder_that_is_not_an_index_is_named_at_startup(small_index_dir, tmp_path, caplog, capsys):
    """`linearrag serve ROOT` serves ROOT's index folders and logs each other subfolder with why it was left out
    (no models are loaded: the store is only made)."""
    import logging
    import shutil

    root = tmp_path / "root"
    root.mkdir()
    copy_index(small_index_dir, root / "alpha")
    (root / "notes").mkdir()  # not an index
    copy_index(small_index_dir, root / "nested" / "inner")  # an index one level too deep
    (root / "stray.txt").write_text("a file, not a folder: not reported")
    with caplog.at_level(logging.WARNING, logger="linearrag.serve"):
        store = Store([root], ServeSettings(mcp=False))
    assert list(store.hosts) == ["alpha"]
    lines = [r.getMessage() for r in caplog.records if r.name == "linearrag.serve"]
    assert len(lines) == 2, lines
    nested, notes = lines
    assert f"not serving {root / 'notes'}: not an index folder (no index.json)" == notes
    assert str(root / "nested") in nested and "holds index folders (inner)" in nested, nested
    # a folder with no index at all is refused before the server starts, each subfolder named with why
    from linearrag_torch.cli import main

    for folder in ("alpha", "nested"):
        shutil.rmtree(root / folder)
    capsys.readouterr()
    assert main(["serve", str(root)]) == 2
    err = capsys.readouterr().err
    assert "no index folder in" in err and f"{root / 'notes'}: not an index folder (no index.json)" in err, err


def test_mcp_without_its_extra_is_a_404_that_names_the_extra_and_a_line_at_startup(tmp_path, monkeypatch, caplog):
    """Without the mcp package (hidden: sys.modules["mcp"] = None) /mcp/ answers a 404 whose detail names the
    extra and its pip command, and the store says at startup that /mcp/ is off and why; --no-mcp says so too.
    The app is made and asked in process (starlette's TestClient without its lifespan: no index is loaded)."""
    import logging
    import sys

    from starlette.testclient import TestClient

    (tmp_path / "root").mkdir()
    store = Store([tmp_path / "root"], ServeSettings())  # mcp on by default
    monkeypatch.setitem(sys.modules, "mcp", None)
    with caplog.at_level(logging.INFO, logger="linearrag.serve"):
        client = TestClient(create_store_app(store))
    said = [r.getMessage() for r in caplog.records if "/mcp/" in r.getMessage()]
    assert said == ["the MCP endpoint /mcp/ is off: the 'mcp' extra is not installed: "
                    'pip install -e ".[mcp]" in a checkout, or pip install "linearrag_torch[mcp]"'], said
    for method, path in (("POST", "/mcp/"), ("GET", "/mcp"), ("POST", "/mcp/anything")):
        r = client.request(method, path, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 404, (path, r.text)
        assert "'mcp' extra is not installed" in r.json()["detail"] and 'pip install -e ".[mcp]"' in r.json()["detail"]
    off = TestClient(create_store_app(store, mcp=False)).post("/mcp/", json={})
    assert off.status_code == 404 and "--no-mcp" in off.json()["detail"], off.text
    assert "/mcp" not in json.dumps(client.get("/openapi.json").json()["paths"])  # not an API route
