"""Answers through a real HTTP chat-completions server (tests/scripted_servers.py) and the official
openai client: retries, timeouts, the disk cache, concurrency, error messages, parsing, the CLI."""
import json
import re
import time

import pytest

pytest.importorskip("openai")

from linearrag_torch import models  # noqa: E402
from linearrag_torch.cli import main  # noqa: E402
from linearrag_torch.config import IndexConfig  # noqa: E402
from linearrag_torch.answers.generation import LLM, Answer, LLMError, ResponseCache, answer_batch, build_messages, judge_batch, parse_answer, parse_verdict

from scripted_servers import ScriptedChatServer, running  # noqa: E402

QUESTION = "Where was the director of film Thunder born?"


@pytest.fixture
def chat():
    with running(ScriptedChatServer()) as server:
        yield server


def make_llm(server, **kw):
    kw.setdefault("cache", None)
    kw.setdefault("backoff", 0.01)
    kw.setdefault("timeout", 5)
    return LLM(server.base_url, "test-model", "sk-secret-key", **kw)


HITS = [[{"id": "p1", "score": 0.9, "title": "Paris", "text": "Paris is the capital of France."},
         {"id": "p2", "score": 0.5, "title": "Lyon", "text": "Lyon is a city in France."}]]


# ------------------------------------------------------------------------------------ protocol
def test_reply_is_parsed_and_request_is_openai_shaped(chat):
    chat.script.append(("reply", "Passage [1] says so.\nAnswer: Paris"))
    [a] = answer_batch(HITS, ["What is the capital of France?"], make_llm(chat), top_k=5)
    assert (a.answer, a.marker_found, a.cached) == ("Paris", True, False)
    assert a.usage == {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
    assert [p["id"] for p in a.passages] == ["p1", "p2"]
    [req] = chat.chat_requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"].get("authorization") == "Bearer sk-secret-key"
    body = req["body"]
    assert body["model"] == "test-model" and body["temperature"] == 0.0 and body["max_tokens"] == 512
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    user = body["messages"][1]["content"]
    assert "[1] Paris\nParis is the capital of France." in user and "[2] Lyon" in user
    assert user.endswith("Question: What is the capital of France?")


def test_429_then_success_is_retried(chat):
    chat.script += [("status", 429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}),
                    ("reply", "Answer: 42")]
    r = make_llm(chat).chat([{"role": "user", "content": "q"}])
    assert (r.text, r.attempts) == ("Answer: 42", 2)
    assert len(chat.chat_requests) == 2


def test_timeout_is_retried_then_succeeds(chat):
    chat.script += [("sleep", 1.0, ("reply", "Answer: late")), ("reply", "Answer: on time")]
    t0 = time.perf_counter()
    r = make_llm(chat, timeout=0.25, max_retries=2).chat([{"role": "user", "content": "q"}])
    assert r.text == "Answer: on time" and r.attempts == 2
    assert time.perf_counter() - t0 < 3


def test_timeouts_exhausting_retries_give_one_clear_line(chat):
    chat.script += [("sleep", 0.8, ("reply", "late"))] * 2
    with pytest.raises(LLMError) as info:
        make_llm(chat, timeout=0.2, max_retries=1).chat([{"role": "user", "content": "q"}])
    msg = str(info.value)
    assert "\n" not in msg
    assert chat.base_url + "/chat/completions" in msg and "0.2 s timeout" in msg and "2 attempts" in msg


def test_500_exhausting_retries_names_url_and_status(chat):
    chat.script += [("status", 500, {"error": {"message": "backend exploded"}})] * 3
    with pytest.raises(LLMError) as info:
        answer_batch(HITS, ["q?"], make_llm(chat, max_retries=2))
    msg = str(info.value)
    assert msg == (f"LLM endpoint {chat.base_url}/chat/completions: HTTP 500: backend exploded "
                   "(gave up after 3 attempts in 0 s)")
    assert info.value.status == 500 and len(chat.chat_requests) == 3


def test_client_error_is_not_retried_and_key_is_masked(chat):
    chat.script.append(("status", 401, {"error": {"message": "bad key sk-secret-key"}}))
    with pytest.raises(LLMError) as info:
        make_llm(chat, max_retries=3).chat([{"role": "user", "content": "q"}])
    msg = str(info.value)
    assert "HTTP 401" in msg and "sk-secret-key" not in msg and "***" in msg
    assert len(chat.chat_requests) == 1
    assert "sk-secret-key" not in repr(make_llm(chat))


@pytest.mark.parametrize("action", [("raw", b"this is not json"), ("json", {"unexpected": True}),
                                    ("json", {"choices": []}),
                                    ("json", {"choices": [{"message": {"role": "assistant", "content": None}}]})])
def test_malformed_reply_is_a_clear_error(chat, action):
    chat.script.append(action)
    with pytest.raises(LLMError, match=r"^LLM endpoint http://127\.0\.0\.1:\d+/v1/chat/completions: malformed reply"):
        make_llm(chat).chat([{"role": "user", "content": "q"}])
    assert len(chat.chat_requests) == 1


def test_reply_without_marker_falls_back_to_whole_reply(chat):
    chat.script.append(("reply", "  The capital is Paris.  "))
    [a] = answer_batch(HITS, ["q?"], make_llm(chat))
    assert (a.answer, a.marker_found, a.reply) == ("The capital is Paris.", False, "  The capital is Paris.  ")


def test_connection_refused_is_a_clear_error():
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = LLM(f"http://127.0.0.1:{port}/v1", "m", cache=None, max_retries=1, backoff=0.01, timeout=2)
    with pytest.raises(LLMError, match=rf"127\.0\.0\.1:{port}/v1/chat/completions: connection failed .*2 attempts"):
        llm.chat([{"role": "user", "content": "q"}])


# ------------------------------------------------------------------------------------ cache and concurrency
def test_cache_makes_a_rerun_free_and_is_keyed_on_model_messages_settings(chat, tmp_path):
    db = tmp_path / "cache.sqlite"
    chat.responder = lambda body: ("reply", f"Answer: {body['messages'][1]['content'][-3:]}")
    qs = ["q1?", "q2?"]
    hits = HITS * 2
    first = answer_batch(hits, qs, make_llm(chat, cache=db))
    assert [a.answer for a in first] == ["q1?", "q2?"] and not any(a.cached for a in first)
    assert len(chat.chat_requests) == 2
    again = answer_batch(hits, qs, make_llm(chat, cache=str(db)))  # a new LLM: the cache is on disk
    assert [a.answer for a in again] == ["q1?", "q2?"] and all(a.cached for a in again)
    assert again[0].usage == first[0].usage and len(chat.chat_requests) == 2
    answer_batch(hits, qs, make_llm(chat, cache=db, temperature=0.5))  # other settings: new requests
    answer_batch(hits, qs, LLM(chat.base_url, "other-model", cache=db, backoff=0.01))  # other model
    answer_batch(hits, qs, make_llm(chat, cache=db), top_k=1)  # other messages (one passage)
    assert len(chat.chat_requests) == 8
    assert len(ResponseCache(db)) == 8
    k = ResponseCache.key("m", [{"role": "user", "content": "x"}], {"temperature": 0.0, "max_tokens": 512})
    assert k == ResponseCache.key("m", [{"content": "x", "role": "user"}], {"max_tokens": 512, "temperature": 0.0})


def test_failures_are_not_cached(chat, tmp_path):
    chat.script.append(("status", 400, {"error": {"message": "bad request"}}))
    llm = make_llm(chat, cache=tmp_path / "c.sqlite")
    with pytest.raises(LLMError):
        llm.chat([{"role": "user", "content": "q"}])
    assert llm.chat([{"role": "user", "content": "q"}]).cached is False


def test_concurrency_is_bounded(chat):
    chat.responder = lambda body: ("sleep", 0.15, ("reply", "Answer: x"))
    llm = make_llm(chat, concurrency=3)
    replies = llm.chat_many([[{"role": "user", "content": f"q{i}"}] for i in range(9)])
    assert len(replies) == 9 and [r.text for r in replies] == ["Answer: x"] * 9
    assert 1 < chat.max_in_flight <= 3  # they overlapped, never more than 3 at once


def test_first_failure_in_a_batch_raises(chat):
    chat.responder = lambda body: (("status", 404, {"error": {"message": "no such model"}})
                                   if body["messages"][0]["content"] == "q3" else ("reply", "Answer: ok"))
    with pytest.raises(LLMError, match="HTTP 404: no such model"):
        make_llm(chat, concurrency=4).chat_many([[{"role": "user", "content": f"q{i}"}] for i in range(6)])


# ------------------------------------------------------------------------------------ parsing and settings
@pytest.mark.parametrize("reply, expected", [
    ("Reasoning.\nAnswer: Paris", ("Paris", True)),
    ("Reasoning.\n**Answer:** *Paris*", ("Paris", True)),
    ("Reasoning.\nFinal answer: \"Paris\"", ("Paris", True)),
    ("answer: no\nWait, more thought.\nAnswer: yes", ("yes", True)),
    ("Reasoning.\nAnswer:\n  Marie Curie\n", ("Marie Curie", True)),
    ("So the final answer: 1912", ("1912", True)),
    ("Paris", ("Paris", False)),
    ("", ("", False)),
])
def test_parse_answer(reply, expected):
    assert parse_answer(reply) == expected


@pytest.mark.parametrize("text, verdict", [("correct", True), ("Incorrect.", False), ("CORRECT\n", True),
                                           ("The answer is not correct", False), ("maybe", None), ("", None)])
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) is verdict


def test_judge_batch(chat):
    chat.responder = lambda body: ("reply", "correct" if "Predicted answer: Paris" in body["messages"][1]["content"]
                                   else "incorrect")
    verdicts, replies = judge_batch(make_llm(chat), ["capital?", "capital?"], [["Paris"], ["Paris"]], ["Paris", "Rome"])
    assert verdicts == [True, False] and chat.chat_requests[0]["body"]["max_tokens"] == 8


def test_settings_from_environment(chat, monkeypatch):
    monkeypatch.setenv("LINEARRAG_LLM_BASE_URL", chat.base_url)
    monkeypatch.setenv("LINEARRAG_LLM_MODEL", "env-model")
    monkeypatch.setenv("LINEARRAG_LLM_API_KEY", "env-key")
    monkeypatch.setenv("LINEARRAG_LLM_CACHE", "off")
    llm = LLM()
    assert llm.cache is None and llm.model == "env-model"
    llm.chat([{"role": "user", "content": "q"}])
    req = chat.chat_requests[-1]
    assert req["headers"]["authorization"] == "Bearer env-key" and req["body"]["model"] == "env-model"
    monkeypatch.delenv("LINEARRAG_LLM_BASE_URL")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(LLMError, match="no LLM endpoint"):
        LLM()


def test_build_messages_without_passages():
    msgs = build_messages("q?", [])
    assert "(no passage was found)" in msgs[1]["content"]


# ------------------------------------------------------------------------------------ with the engine
def test_rag_answer_uses_top_k_passages(chat, small_rag, small_questions):
    chat.responder = lambda body: ("reply", "Because.\nAnswer: somewhere")
    qs = [q["question"] for q in small_questions[:2]]
    answers = small_rag.answer(qs, llm=make_llm(chat), top_k=3)
    expected = small_rag.search(qs, top_k=3)
    assert all(isinstance(a, Answer) for a in answers)
    assert [[p.id for p in a.passages] for a in answers] == [[h.id for h in hs] for hs in expected]
    assert all(a.answer == "somewhere" for a in answers)
    prompts = {r["body"]["messages"][1]["content"].rsplit("Question: ", 1)[1]: r["body"]["messages"][1]["content"]
               for r in chat.chat_requests}  # requests run concurrently: match them by question
    for q, hs in zip(qs, expected):
        assert all(f"[{i}] {h.title}" in prompts[q] for i, h in enumerate(hs, 1))
    single = small_rag.answer(qs[0], llm=make_llm(chat), top_k=2, mode="paper")
    assert isinstance(single, Answer) and len(single.passages) == 2
    d = single.to_dict()
    assert set(d) == {"question", "answer", "reply", "marker_found", "cached", "usage", "passages"}
    assert set(d["passages"][0]) == {"id", "score", "title", "text"}


# ------------------------------------------------------------------------------------ CLI
@pytest.fixture
def shared_models(nlp, encoder, monkeypatch):
    default = IndexConfig()
    real_nlp, real_encoder = models.load_nlp, models.load_encoder
    monkeypatch.setattr(models, "load_nlp", lambda cfg: nlp if cfg.spacy_model == default.spacy_model else real_nlp(cfg))
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device, *a, **k: encoder if cfg.encoder == default.encoder
                        else real_encoder(cfg, device, *a, **k))


def run_cli(capsys, *argv):
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_answer_json_cache_and_errors(chat, small_index_dir, shared_models, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LINEARRAG_LLM_API_KEY", "sk-from-env")
    chat.responder = lambda body: ("reply", "Two passages agree.\nAnswer: London")
    common = ["--llm-base-url", chat.base_url, "--llm-model", "m", "--device", "cpu",
              "--llm-cache", tmp_path / "c.sqlite"]
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"id": "x7", "question": "Who directed Thunder?"}) + "\n")
    rc, out, err = run_cli(capsys, "answer", small_index_dir, QUESTION, "--questions", qfile, "--top-k", 2, "--json",
                           *common)
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == [0, "x7"] and all(r["answer"] == "London" for r in rows)
    assert all(len(r["passages"]) == 2 and r["marker_found"] for r in rows)
    assert "0 replies from the cache, 120 tokens spent" in err and "sk-from-env" not in out + err
    rc, out, err = run_cli(capsys, "answer", small_index_dir, QUESTION, "--top-k", 2, *common)  # text, cached
    assert rc == 0 and "A: London" in out and "1 reply from the cache, 0 tokens spent" in err
    assert len(chat.chat_requests) == 2

    chat.responder = lambda body: ("status", 503, {"error": {"message": "overloaded"}})
    rc, out, err = run_cli(capsys, "answer", small_index_dir, "Another question?", *common, "--llm-max-retries", 1)
    assert rc == 2 and out == ""
    url = re.escape(f"{chat.base_url}/chat/completions")
    waiting, error = err.strip().splitlines()  # what it waits for, then one line when it gives up
    assert re.fullmatch(rf"linearrag answer: waiting: LLM endpoint {url}: HTTP 503: overloaded; attempt 2 of 2 in "
                        r"\d\.\d s \(the last\)", waiting), waiting
    assert re.fullmatch(rf"linearrag answer: error: LLM endpoint {url}: HTTP 503: overloaded \(gave up after 2 "
                        r"attempts in \d+ s\)", error), error


def test_cli_answer_against_a_refused_endpoint_says_what_it_waits_for(small_index_dir, shared_models, capsys,
                                                                      tmp_path):
    """Nothing listens at the URL: before each wait a line says what failed, how long the wait is and how long
    the waits left can be (it was silent for ~19 s), then one line gives up and says what to do; exit 2,
    nothing on stdout, nothing cached."""
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    cache = tmp_path / "c.sqlite"
    rc, out, err = run_cli(capsys, "answer", small_index_dir, QUESTION, "--llm-base-url", base, "--llm-model", "m",
                           "--device", "cpu", "--llm-cache", cache, "--llm-max-retries", 2)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 3, err
    url = re.escape(f"{base}/chat/completions")
    assert re.fullmatch(rf"linearrag answer: waiting: LLM endpoint {url}: connection failed \(.+\); attempt 2 of 3 "
                        r"in \d\.\d s \(then waits of up to 2 s more before giving up\)", lines[0]), lines[0]
    assert re.fullmatch(rf"linearrag answer: waiting: .*; attempt 3 of 3 in \d\.\d s \(the last\)", lines[1]), lines[1]
    assert re.fullmatch(rf"linearrag answer: error: LLM endpoint {url}: connection failed \(.+\) \(gave up after 3 "
                        rf"attempts in \d+ s\); nothing answers at {re.escape(base)}: start the server there, or give "
                        r"another URL \(--llm-base-url or \$LINEARRAG_LLM_BASE_URL\)", lines[2]), lines[2]
    from linearrag_torch.answers.generation import ResponseCache

    assert not cache.exists() or len(ResponseCache(cache)) == 0


def test_cli_answer_without_endpoint_exits_2(small_index_dir, capsys, monkeypatch):
    for var in ("LINEARRAG_LLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    rc, out, err = run_cli(capsys, "answer", small_index_dir, QUESTION, "--llm-model", "m")
    assert rc == 2 and "no LLM endpoint" in err and len(err.strip().splitlines()) == 1

