"""Writes to a served index under query load: `linearrag add` / `delete` (the real commands) on the folder that a real
`linearrag serve` process serves, each followed by POST /admin/reload, while clients query without pause.

Every query must succeed, and every answer must be the answer of the index before or after a reload that ran while
it was in flight: the test keeps a copy of the folder after each write, and computes each state's answers in this
process with LinearRAG.search (the same models), as the independent reference. Also: the fingerprint a load
reports is that of the index.json it read, or None when a writer committed during the load.
"""
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.serve import LinearRAGService, ServeSettings, create_app  # noqa: E402

from conftest import write_jsonl  # noqa: E402
from test_serve import TIMEOUT, copy_index, free_port, running, serving, wait_healthy, wait_ready  # noqa: E402

NEW_A = [{"id": "load-a1", "title": "Zorblax Quentavian",
          "text": "Zorblax Quentavian was a chemist born in Vormelund who discovered glowing salt."},
         {"id": "load-a2", "title": "Vormelund",
          "text": "Vormelund is a harbour town on the Quentavian coast, known for its salt works."}]
NEW_B = [{"id": "load-b1", "title": "Ilsabet Marrowind",
          "text": "Ilsabet Marrowind directed the silent film The Copper Lantern in Grusenholm."}]
OWN_QUESTIONS = ["Where was Zorblax Quentavian born?", "What is Vormelund known for?",
                 "Who directed the film The Copper Lantern?"]


def fingerprint(folder: Path) -> str:
    return hashlib.sha256((folder / "index.json").read_bytes()).hexdigest()[:16]


def cli(*argv) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "linearrag_torch.cli", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT * 4)
    assert proc.returncode == 0, proc.stderr


def test_add_and_delete_with_reloads_under_query_load_fail_no_query(small_index_dir, small_questions, nlp, encoder,
                                                                     tmp_path):
    folder = copy_index(small_index_dir, tmp_path / "index")
    a, b = write_jsonl(tmp_path / "a.jsonl", NEW_A), write_jsonl(tmp_path / "b.jsonl", NEW_B)
    writes = [("add", folder, a, "--quiet", "--device", "cpu"), ("add", folder, b, "--quiet", "--device", "cpu"),
              ("delete", folder, "--ids-file", a), ("delete", folder, "--ids", "load-b1")]
    questions = OWN_QUESTIONS + [q["question"] for q in small_questions[:3]]
    states = [copy_index(folder, tmp_path / "state-0")]  # the folder after each write
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    server = subprocess.Popen([sys.executable, "-m", "linearrag_torch.cli", "serve", str(folder), "--port", str(port),
                               "--device", "cpu", "--log-level", "warning"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reloaded = [0]  # reloads answered so far (the state the server serves at least)
    answers, failures = [], []
    stop = threading.Event()

    def client(i):
        with httpx.Client(timeout=TIMEOUT) as c:
            for n in range(5000):  # bounded; stopped when the writes are done
                if stop.is_set():
                    return
                q = questions[(i + n) % len(questions)]
                first = reloaded[0]
                try:
                    r = c.post(url + "/v1/search", json={"question": q, "top_k": 5})
                except httpx.HTTPError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                if r.status_code != 200:
                    failures.append(f"{r.status_code}: {r.text[:200]}")
                    continue
                answers.append((q, first, reloaded[0], [(h["id"], h["score"]) for h in r.json()["results"][0]["hits"]]))

    try:
        wait_healthy(server, url, TIMEOUT * 2)
        assert httpx.get(url + "/health").json()["fingerprint"] == fingerprint(folder)
        clients = [threading.Thread(target=client, args=(i,)) for i in range(2)]
        for t in clients:
            t.start()
        for k, argv in enumerate(writes, 1):
            cli(*argv)
            states.append(copy_index(folder, tmp_path / f"state-{k}"))
            r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
            assert r.status_code == 200, r.text
            assert r.json()["fingerprint"] == fingerprint(folder)
            reloaded[0] = k
            assert httpx.get(url + "/health").json()["fingerprint"] == fingerprint(folder)
        time.sleep(1.0)  # queries on the last state too
        stop.set()
        for t in clients:
            t.join(TIMEOUT)
        server.send_signal(signal.SIGTERM)
        assert server.wait(TIMEOUT) == 0, server.stderr.read()
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stderr.close()
    assert not failures, failures[:5]
    # the reference: each state's answers, computed here
    expected = []
    for state in states:
        rag = LinearRAG.load(state, device="cpu")
        rag.models.nlp, rag.models.encoder = nlp, encoder
        expected.append({q: [(h.id, h.score) for h in hs] for q, hs in zip(questions, rag.search(questions, top_k=5))})
    for k in range(len(states) - 1):  # each write changes the answers: the states can be told apart
        assert any([x[0] for x in expected[k][q]] != [x[0] for x in expected[k + 1][q]] for q in questions), k
    assert [x[0] for x in expected[1][OWN_QUESTIONS[0]]][0] == "load-a1"

    def matches(got, want):
        return [x[0] for x in got] == [x[0] for x in want] and all(abs(g[1] - w[1]) < 1e-4 for g, w in zip(got, want))

    served = set()
    for q, first, last, hits in answers:
        # in flight from `first` reloads answered to `last`: the reload after write last+1 may have swapped already
        candidates = [k for k in range(first, min(last + 1, len(states) - 1) + 1) if matches(hits, expected[k][q])]
        assert candidates, (q, first, last, hits)
        served.update(candidates if len(candidates) == 1 else ())
    assert len(answers) >= 20 and served == set(range(len(states))), (len(answers), served)
    print(f"{len(answers)} queries answered during {len(writes)} writes and reloads, 0 failed; each the answer of "
          f"the state before or after a reload; all {len(states)} states seen")


def test_a_commit_during_a_load_leaves_no_wrong_fingerprint(small_rag, small_index_dir, tmp_path):
    """A writer commits while the server loads (the first load, then a reload): the load may have read either
    index.json, so the fingerprint is None, not the one of the other index; the next reload reports the right one."""
    folder = copy_index(small_index_dir, tmp_path / "index")
    victim = small_rag.index.passage_ids[0]
    smaller = LinearRAG(small_rag.index, "cpu").delete([victim])

    class Racing(LinearRAGService):
        def _load_rag(self, like):
            smaller.index.save(folder)  # a writer commits during the load
            return small_rag if like is None else LinearRAG(smaller.index, "cpu", small_rag.nlp, small_rag.encoder)

    service = Racing(folder, ServeSettings())
    with running(create_app(service)) as url:
        assert wait_ready(url)["fingerprint"] is None
        r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["fingerprint"] is None, r.text
    with serving(small_rag, folder) as (url, plain):  # no writer: the fingerprint of the folder's index.json
        assert httpx.get(url + "/health").json()["fingerprint"] == fingerprint(folder)
        r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["fingerprint"] == fingerprint(folder)
