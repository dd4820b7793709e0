"""python -m benchmarks.qa end to end on the small index against the scripted chat-completions server."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("matplotlib")

from linearrag_torch.answers.generation import JUDGE_PROMPT  # noqa: E402

from conftest import small_passages, write_jsonl  # noqa: E402
from scripted_servers import ScriptedChatServer, running  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_models(nlp, encoder, monkeypatch):
    """In-process runs reuse the session's models (the first run is a real subprocess that loads its own)."""
    from linearrag_torch import models

    monkeypatch.setattr(models, "load_nlp", lambda cfg, *a, **k: nlp)
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device, *a, **k: encoder)


def run_in_process(argv, capsys):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.qa import main

    capsys.readouterr()
    rc = main(argv)
    return rc, *capsys.readouterr()


def test_qa_benchmark_end_to_end(small_questions, small_index_dir, tmp_path, shared_models, capsys):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "corpus.jsonl", small_passages())
    write_jsonl(data / "questions.jsonl", small_questions)
    gold = {q["question"]: q["answers"][0] for q in small_questions}
    order = [q["question"] for q in small_questions]

    def responder(body):
        msgs = body["messages"]
        if msgs[0]["content"] == JUDGE_PROMPT:
            user = msgs[1]["content"]
            q = re.search(r"^Question: (.*)$", user, re.M).group(1)
            pred = re.search(r"^Predicted answer: (.*)$", user, re.M).group(1)
            return ("reply", "correct" if gold[q].lower() in pred.lower() else "Incorrect.")
        q = msgs[1]["content"].rsplit("Question: ", 1)[1]
        i = order.index(q)
        if i in (0, 1):  # right
            return ("reply", f"Passages [1] and [2].\nAnswer: {gold[q]}")
        if i == 2:  # right, with more words: containment and the judge accept it, EM does not
            return ("reply", f"Answer: I believe it is the {gold[q]}, founded long ago")
        if i == 3:  # no marker: the whole reply is the prediction
            return ("reply", "I cannot tell.")
        return ("reply", "Answer: Nobody")  # wrong

    with running(ScriptedChatServer(responder)) as chat:
        out, png = tmp_path / "qa.json", tmp_path / "qa.png"
        cmd = [sys.executable, "-m", "benchmarks.qa", "--data", str(data), "--index", str(small_index_dir),
               "--device", "cpu", "--llm-base-url", chat.base_url, "--llm-model", "scripted",
               "--llm-cache", str(tmp_path / "cache.sqlite"), "--json", str(out), "--png", str(png)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        res = json.loads(out.read_text())
        n = len(small_questions)
        assert len(chat.chat_requests) == 2 * n  # one answer and one verdict per question
        o = res["overall"]
        assert o["n"] == o["n_with_answers"] == n
        assert o["em"] == pytest.approx(100 * 2 / n, abs=0.01)
        assert o["contains"] == pytest.approx(100 * 3 / n, abs=0.01)
        assert o["judge"] == pytest.approx(100 * 3 / n, abs=0.01) and o["judge_unparsed"] == 0
        assert 100 * 2 / n < o["f1"] < 100 * 3 / n
        assert o["marker_missing"] == 1 and o["recall"] is not None and o["n_with_gold_passages"] == n
        assert set(res["per_type"]) == {q["type"] for q in small_questions}
        assert sum(t["n"] for t in res["per_type"].values()) == n
        toks = res["tokens"]
        assert toks["generation"]["requests"] == n and toks["generation"]["spent"]["total_tokens"] == 60 * n
        assert toks["judge"]["requests"] == n
        assert all(res["time_s"][k] >= 0 for k in ("retrieve", "generate", "judge", "total"))
        assert res["questions"][3]["prediction"] == "I cannot tell." and not res["questions"][3]["marker_found"]
        assert all(len(r["passages"]) == 5 for r in res["questions"])
        assert png.stat().st_size > 0
        assert "scripted" in proc.stdout and "EM" in proc.stdout

        # a rerun is answered from the cache: no request, no tokens spent, the same numbers
        rc, _, err = run_in_process(cmd[3:] + ["--limit", "3", "--no-judge"], capsys)
        assert rc == 0, err
        again = json.loads(out.read_text())
        assert len(chat.chat_requests) == 2 * n
        assert again["tokens"]["generation"]["cached"] == 3 and again["tokens"]["generation"]["spent"] == {}
        assert again["overall"]["judge"] is None and again["tokens"]["judge"] is None

        # an endpoint failure: exit 2 and one line naming the URL and status
        chat.responder = lambda body: ("status", 500, {"error": {"message": "down"}})
        rc, _, err = run_in_process(cmd[3:] + ["--no-llm-cache", "--llm-max-retries", "0", "--limit", "1"], capsys)
        assert rc == 2
        assert re.fullmatch(
            re.escape(f"benchmarks.qa: error: LLM endpoint {chat.base_url}/chat/completions: HTTP 500: down ")
            + r"\(gave up after 1 attempt in \d+ s\)", err.strip().splitlines()[-1]), err
