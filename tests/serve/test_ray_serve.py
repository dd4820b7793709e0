"""`linearrag serve --ray`: the Ray Serve application (serve/ray_app.py) on a local Ray started here.

One application for the module (2 engine replicas on a 2-CPU local Ray, HTTP on 127.0.0.1): results equal
the single-process server's; a bounded burst past --max-concurrent + --max-queued gives only 200s and
429s (with Retry-After); an engine replica killed during a bounded load is replaced and every request is
answered 200 or with a status the client can retry (429/503). Every wait is bounded.
"""
import asyncio
import socket
import threading
import time
from collections import Counter

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve")
import ray  # noqa: E402
from ray import serve  # noqa: E402

from linearrag_torch.serve import LinearRAGService, ServeSettings  # noqa: E402
from linearrag_torch.serve import ray_app  # noqa: E402
from linearrag_torch.serve.ray_app import ENGINE, RaySettings, build_app, deployment_options  # noqa: E402

TIMEOUT = 60  # seconds any single request may take
REPLACE_TIMEOUT = 240  # seconds for a killed replica's successor to load the models and the index
REPLICAS = 2
MAX_CONCURRENT = 4  # requests each engine replica takes at once (Ray's max_ongoing_requests)
MAX_QUEUED = 4  # requests waiting for a replica; one more is a 429
RETRYABLE = {429, 503}
ATTEMPTS = 8  # tries of a client that comes back after a retryable refusal
MAX_RETRY_AFTER_S = 3  # ... waiting the Retry-After it was given, at most this long


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_replicas() -> set:
    """Names of the live engine replica actors (ray.util.list_named_actors; no dashboard needed)."""
    prefix = f"SERVE_REPLICA::{ray_app.APP_NAME}#{ENGINE}#"
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)}


def running_engine_replicas() -> int:
    return ray_app._replica_states().get(ENGINE, {}).get("RUNNING", 0)


@pytest.fixture(scope="module")
def chat():
    """A scripted OpenAI-compatible chat server on 127.0.0.1 for /v1/answer (every reply: "Answer: Paris")."""
    from scripted_servers import ScriptedChatServer, running

    server = ScriptedChatServer(lambda body: ("reply", "The passages say so.\nAnswer: Paris"))
    with running(server):
        yield server


@pytest.fixture(scope="module")
def ray_url(small_index_dir, chat, tmp_path_factory):
    """The application on a local Ray: (base URL, settings); its ingress answers /v1/answer with ``chat``."""
    import functools

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}})
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # the replicas use the test process's torch threads: a sum over other threads may round differently
        settings = ServeSettings(max_concurrent=MAX_CONCURRENT, max_batch_size=8, timeout=TIMEOUT,
                                 threads=torch.get_num_threads())
        ray_settings = RaySettings(ray=True, replicas=REPLICAS, max_queued=MAX_QUEUED)
        llm_factory = None
        if _has("openai"):
            from linearrag_torch.answers.generation import LLM

            cache = tmp_path_factory.mktemp("llm") / "cache.sqlite"
            llm_factory = functools.partial(LLM, chat.base_url, "scripted-model", "chat-key", cache=cache, max_retries=0)
        serve.run(build_app(small_index_dir, settings, ray_settings, llm_factory), name=ray_app.APP_NAME,
                  route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200
        yield url, settings
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def disk_rag(small_index_dir, nlp, encoder):
    """The index as the replicas see it: loaded from its folder (the session's models)."""
    from linearrag_torch import LinearRAG
    from linearrag_torch.index import TriGraphIndex

    return LinearRAG(TriGraphIndex.load(small_index_dir, device="cpu"), "cpu", nlp=nlp, encoder=encoder)


def single_process(rag, bodies) -> list:
    """What the single-process server (LinearRAGService in process, same index) answers to each body."""
    async def go():
        service = LinearRAGService(None, ServeSettings(), rag=rag)
        async with service.lifespan():
            deadline = time.monotonic() + TIMEOUT
            while not service.ready:
                assert time.monotonic() < deadline and not service.load_error, service.load_error
                await asyncio.sleep(0.02)
            return [await service.search(b) for b in bodies]
    return asyncio.run(go())


def assert_same(got: dict, want: dict) -> None:
    assert [r["question"] for r in got["results"]] == [r["question"] for r in want["results"]]
    for g, w in zip(got["results"], want["results"]):
        assert [(h["id"], h["title"], h.get("text")) for h in g["hits"]] == \
               [(h["id"], h["title"], h.get("text")) for h in w["hits"]], g["question"]
        # as tests/serve/test_serve.py: the same passages in the same order, scores within 1e-5
        assert all(abs(hg["score"] - hw["score"]) < 1e-5 for hg, hw in zip(g["hits"], w["hits"])), g["question"]


def burst(url: str, bodies: list, clients: int) -> list:
    """Send ``bodies`` with ``clients`` concurrent connections; the status (or exception name) of each."""
    async def go():
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as http:
            async def one(b):
                try:
                    return await http.post(url + "/v1/search", json=b)
                except httpx.HTTPError as exc:
                    return type(exc).__name__
            return await asyncio.gather(*(one(b) for b in bodies))
    return asyncio.run(go())


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


# ---------------------------------------------------------------------------------------------- equality
def test_results_equal_single_process_server(ray_url, disk_rag, small_questions):
    url, _ = ray_url
    qs = [q["question"] for q in small_questions]
    bodies = [{"questions": qs, "top_k": 5},
              {"question": qs[0], "top_k": 3, "include_text": True},
              {"questions": qs[2:5], "mode": "paper", "chain_passages": 0, "delta": 0.3}]
    want = single_process(disk_rag, bodies)
    questions_before = metric(url, "linearrag_questions_total")
    for body, w in zip(bodies, want):
        r = httpx.post(url + "/v1/search", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert_same(r.json(), w)
    # concurrent one-question requests (Ray's @serve.batch coalesces them) answer as the same questions alone;
    # fewer clients than MAX_QUEUED: Ray counts a request as queued until a replica took it, so a burst of
    # MAX_QUEUED or more may see a 429 even with free replica slots
    resps = burst(url, [{"question": q} for q in qs * 2], clients=MAX_QUEUED - 1)
    assert all(not isinstance(r, str) and r.status_code == 200 for r in resps), resps
    alone = single_process(disk_rag, [{"question": q} for q in qs])
    for r, w in zip(resps, alone * 2):
        assert_same(r.json(), w)
    # every engine call's statistics reached the ingress's /metrics: the questions answered, counted once
    sent = len(qs) + 1 + 3 + 2 * len(qs)
    assert metric(url, "linearrag_questions_total") - questions_before == sent


def test_answer_route_through_ray(ray_url, chat, small_questions):
    """/v1/answer on the Ray application: the ingress asks the engine replicas for the hits (those of /v1/search)
    and the chat model for the answers; a failing chat endpoint is a 502 naming it."""
    pytest.importorskip("openai")
    import json

    url, _ = ray_url
    qs = [q["question"] for q in small_questions[:2]]
    r = httpx.post(url + "/v1/answer", json={"questions": qs, "top_k": 3}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [a["question"] for a in res] == qs and all(a["answer"] == "Paris" and a["marker_found"] for a in res)
    hits = httpx.post(url + "/v1/search", json={"questions": qs, "top_k": 3}, timeout=TIMEOUT).json()["results"]
    assert [[(p["id"], p["title"]) for p in a["passages"]] for a in res] == \
        [[(h["id"], h["title"]) for h in q["hits"]] for q in hits]
    prompts = [json.dumps(c["body"]["messages"]) for c in chat.chat_requests]
    for q, found in zip(qs, hits):  # each prompt holds its question's passages
        prompt = next(p for p in prompts if json.dumps(q)[1:-1] in p)
        assert all(json.dumps(h["title"])[1:-1] in prompt for h in found["hits"])
    assert httpx.get(url + "/info", timeout=TIMEOUT).json()["llm"] == {"base_url": chat.base_url,
                                                                        "model": "scripted-model"}
    chat.script.append(("status", 401))
    r = httpx.post(url + "/v1/answer", json={"question": "Who founded the company, according to the records?"},
                   timeout=TIMEOUT)
    assert r.status_code == 502 and chat.base_url in r.text and "401" in r.text


def test_same_validation_and_routes(ray_url):
    url, settings = ray_url
    r = httpx.post(url + "/v1/search", json={"question": "x", "top_k": settings.max_top_k + 1}, timeout=TIMEOUT)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "top_k"]
    r = httpx.post(url + "/v1/search", json={"question": "x", "colour": "red"}, timeout=TIMEOUT)
    assert r.status_code == 422 and "colour" in r.text
    r = httpx.post(url + "/v1/search", content=b"{not json", timeout=TIMEOUT)
    assert r.status_code == 422 and "invalid JSON" in r.text
    r = httpx.post(url + "/v1/search", content=b"x" * (settings.max_body_bytes + 1), timeout=TIMEOUT)
    assert r.status_code == 413
    info = httpx.get(url + "/info", timeout=TIMEOUT).json()
    assert info["index"]["passages"] == 60 and info["ready"] is True
    assert info["ray"]["replicas"][ENGINE] == {"RUNNING": REPLICAS}
    assert info["server"]["max_concurrent"] == MAX_CONCURRENT
    r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
    assert r.status_code == 409 and "--watch" in r.text  # replicas reload themselves (--watch), not by this route


# ---------------------------------------------------------------------------------------------- backpressure
def test_backpressure_gives_429_and_no_other_failure(ray_url, small_questions):
    url, _ = ray_url
    qs = [q["question"] for q in small_questions]
    capacity = REPLICAS * MAX_CONCURRENT + MAX_QUEUED
    n = 4 * capacity  # past what the ingress admits (capacity): the front refuses the rest before Ray sees them
    overloaded_before = metric(url, 'linearrag_failures_total{reason="overloaded"}')
    resps = burst(url, [{"questions": qs} for _ in range(n)], clients=n)
    statuses = Counter(r if isinstance(r, str) else r.status_code for r in resps)
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[200] >= 1 and statuses[429] >= 1, statuses
    for r in resps:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1 and "retry" in r.text  # Ray's 1, or the front's from the queue
    assert metric(url, 'linearrag_failures_total{reason="overloaded"}') - overloaded_before == statuses[429]
    # and it recovers: the next request is answered
    assert httpx.post(url + "/v1/search", json={"question": qs[0]}, timeout=TIMEOUT).status_code == 200


# ---------------------------------------------------------------------------------------------- fault
def test_killed_replica_is_replaced_and_no_request_is_lost(ray_url, small_questions):
    url, _ = ray_url
    qs = [q["question"] for q in small_questions]
    before = engine_replicas()
    assert len(before) == REPLICAS
    victim = sorted(before)[0]
    # bounded load: 24 requests of 24 questions (long engine calls: the victim is busy when it is killed); heavy
    # requests (serve/admission.py) that find the heavy share taken are refused with a Retry-After and come back
    clients, per_client, n_q = 4, 6, 24
    outcomes: list = []
    done = threading.Event()
    answered = Counter()

    async def load():
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            async def client(i):
                for j in range(per_client):
                    body = {"questions": [qs[(i + j + k) % len(qs)] for k in range(n_q)]}
                    for attempt in range(ATTEMPTS):  # a client that honours Retry-After (bounded), as clients should
                        try:
                            r = await http.post(url + "/v1/search", json=body)
                        except httpx.HTTPError as exc:
                            outcome = type(exc).__name__
                            break
                        outcome = r.status_code
                        if r.status_code == 200:
                            assert len(r.json()["results"]) == n_q
                        if r.status_code not in RETRYABLE or attempt == ATTEMPTS - 1:
                            break
                        answered["refused"] += 1
                        await asyncio.sleep(min(MAX_RETRY_AFTER_S, int(r.headers.get("retry-after", 1))))
                    outcomes.append(outcome)
                    answered["n"] += 1
            await asyncio.gather(*(client(i) for i in range(clients)))

    thread = threading.Thread(target=lambda: (asyncio.run(load()), done.set()), daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while answered["n"] < clients and time.monotonic() < deadline and not done.is_set():
        time.sleep(0.01)
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)  # mid-load: its searches in flight die
    thread.join(clients * per_client * (TIMEOUT + ATTEMPTS * MAX_RETRY_AFTER_S))
    assert done.is_set(), "the load did not finish"
    statuses = Counter(outcomes)
    print(f"killed {victim}: {dict(statuses)}, refusals the clients came back after: {answered['refused']}, "
          f"searches retried on another replica: {metric(url, 'linearrag_replica_retries_total'):.0f}")
    assert len(outcomes) == clients * per_client
    assert set(statuses) <= {200} | RETRYABLE, statuses  # nothing lost without a status the client can retry
    assert statuses[200] >= clients * per_client // 2, statuses
    # Ray Serve replaces the replica: a new one (another name) loads the index and runs
    deadline = time.monotonic() + REPLACE_TIMEOUT
    while True:
        now = engine_replicas()
        if victim not in now and len(now) == REPLICAS and running_engine_replicas() == REPLICAS:
            break
        assert time.monotonic() < deadline, f"not replaced within {REPLACE_TIMEOUT} s: {now}"
        time.sleep(0.5)
    assert now - before, "no new replica"
    resps = burst(url, [{"question": q} for q in qs], clients=MAX_QUEUED - 1)
    assert all(not isinstance(r, str) and r.status_code == 200 for r in resps), resps


# ---------------------------------------------------------------------------------------------- settings
def test_deployment_options(monkeypatch):
    s = ServeSettings(max_concurrent=32, max_batch_size=16)
    monkeypatch.setattr(ray_app, "_gpus_in_cluster", lambda: 0.0)
    engine, ingress = deployment_options(s, RaySettings(ray=True))
    assert engine["num_replicas"] == 1 and engine["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert engine["max_ongoing_requests"] == 32 and engine["max_queued_requests"] == 256
    assert engine["backpressure_config"].status_code == 429 and engine["backpressure_config"].retry_after_s == 1
    assert ingress["ray_actor_options"] == {"num_cpus": 0}
    # the ingress never refuses what the engine would hold
    assert ingress["max_ongoing_requests"] >= 32 + 256 and ingress["max_queued_requests"] >= 32 + 256
    # one replica per GPU where the cluster has GPUs
    monkeypatch.setattr(ray_app, "_gpus_in_cluster", lambda: 4.0)
    engine, _ = deployment_options(s, RaySettings(ray=True))
    assert engine["num_replicas"] == 4 and engine["ray_actor_options"]["num_gpus"] == 1.0
    engine, ingress = deployment_options(s, RaySettings(ray=True, autoscale="1,6", target_ongoing=8))
    assert "num_replicas" not in engine
    assert engine["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 6, "initial_replicas": 1,
                                            "target_ongoing_requests": 8}
    assert ingress["max_ongoing_requests"] >= 6 * 32 + 256


def test_ray_settings_errors():
    with pytest.raises(ValueError, match="not both"):
        RaySettings(replicas=2, autoscale="1,3")
    with pytest.raises(ValueError, match="MIN,MAX"):
        RaySettings(autoscale="3")
    with pytest.raises(ValueError, match="MIN <= MAX"):
        RaySettings(autoscale="4,2")
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        RaySettings(replicas=0)
    with pytest.raises(ValueError, match="unknown setting"):
        ray_app.app_builder({"index_dir": "x", "replicaz": "2"})
    coerced = ray_app._coerce(RaySettings, {"replicas": "3", "replica_gpus": "none", "ray": "true"})
    assert coerced == {"replicas": 3, "replica_gpus": None, "ray": True}


def test_cli_ray_flags_need_ray(tmp_path, capsys):
    from linearrag_torch.cli import main

    assert main(["serve", str(tmp_path), "--replicas", "2"]) == 2
    assert "need --ray" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--ray", "--replicas", "2", "--autoscale", "1,2"]) == 2
    assert "not both" in capsys.readouterr().err


def test_serve_ray_prints_a_line_for_the_cluster_and_no_ray_noise(small_index_dir):
    """`linearrag serve --ray` as a user runs it (a new local Ray): one line for the cluster, the serving line,
    the stopping line on SIGTERM and the replicas' own log lines; none of Serve's controller and proxy start-up
    INFO lines, no token-authentication notice, no warnings (issue 37)."""
    import signal
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "linearrag_torch.cli", "serve", str(small_index_dir), "--ray",
                             "--ray-address", "local", "--port", str(port), "--replicas", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip() for line in proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("serving ") for line in lines) and time.monotonic() < deadline:
            assert proc.poll() is None, lines
            time.sleep(1)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
        reader.join(timeout=10)
    assert rc == 0, lines
    ours = [line for line in lines if "(ServeReplica:" not in line]
    assert ours[0].startswith("Ray: a new local Ray cluster, 1 node, "), lines
    assert ours[1].startswith(f"serving {small_index_dir} at http://127.0.0.1:{port}/ with Ray Serve (1 engine replica "
                              "running)"), lines
    assert ours[2:] == ["stopping: the replicas finish the requests in flight"], lines
