"""Tiny real HTTP servers on 127.0.0.1 for the tests (http.server in a daemon thread, a free port).

ScriptedChatServer speaks the chat-completions protocol (POST /v1/chat/completions, OpenAI's JSON
response shape with usage): each request takes the next scripted action, then ``responder(body)``
once the script is used up. FakeSearchServer speaks `linearrag serve`'s POST /v1/search schema on top
of a search function (e.g. a LinearRAG's search).
"""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server:
    def __init__(self):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw or b"null")
                except json.JSONDecodeError:
                    body = None
                with owner.lock:
                    owner.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                try:
                    status, payload, headers = owner.handle(self.path, dict(self.headers), body)
                finally:
                    with owner.lock:
                        owner.in_flight -= 1
                if status is None:  # hang up without a reply
                    self.close_connection = True
                    return
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0  # requests being handled now / at most at once
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def handle(self, path, headers, body):  # -> (status, payload, headers); status None: hang up, no reply
        raise NotImplementedError

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


def completion(text: str, prompt_tokens: int = 50, completion_tokens: int = 10, model: str = "scripted") -> dict:
    """An OpenAI chat.completion JSON object with usage."""
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class ScriptedChatServer(_Server):
    """Actions (tuples): ("reply", text) | ("status", code[, json_body[, headers]]) | ("sleep", seconds, action)
    | ("raw", bytes) (a 200 with this body) | ("json", obj) (a 200 with this JSON)."""

    def __init__(self, responder=None):
        super().__init__()
        self.script: list = []
        self.responder = responder or (lambda body: ("reply", "I think so.\nAnswer: yes"))
        self._script_lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def chat_requests(self) -> list[dict]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    def handle(self, path, headers, body):
        if not path.endswith("/v1/chat/completions"):
            return 404, {"error": {"message": f"no route {path}"}}, None
        with self._script_lock:
            action = self.script.pop(0) if self.script else self.responder(body)
        return self._do(action, body)

    def _do(self, action, body):
        kind = action[0]
        if kind == "sleep":
            time.sleep(action[1])
            return self._do(action[2], body)
        if kind == "reply":
            return 200, completion(action[1], model=(body or {}).get("model", "scripted")), None
        if kind == "status":
            payload = action[2] if len(action) > 2 else {"error": {"message": f"scripted {action[1]}", "type": "test"}}
            return action[1], payload, action[3] if len(action) > 3 else None
        if kind == "raw":
            return 200, action[1], None
        if kind == "json":
            return 200, action[1], None
        raise ValueError(f"unknown action {action!r}")


class FakeSearchServer(_Server):
    """POST /v1/search as `linearrag serve` speaks it, answered by ``search(questions, top_k, **settings)``
    (a LinearRAG's search); requires "Authorization: Bearer api_key" when api_key is set. ``refusals``: the
    first requests' answers instead, in order: (status, headers) or "hang up" (close without a reply)."""

    def __init__(self, search, api_key: str | None = None, delay: float = 0.0, refusals=()):
        super().__init__()
        self.search, self.api_key, self.delay = search, api_key, delay
        self.refusals = list(refusals)

    def handle(self, path, headers, body):
        if path != "/v1/search":
            return 404, {"detail": "Not Found"}, None
        with self.lock:
            refusal = self.refusals.pop(0) if self.refusals else None
        if refusal == "hang up":
            return None, None, None
        if refusal is not None:
            status, extra = refusal
            return status, {"detail": f"scripted {status}"}, extra
        if self.delay:
            time.sleep(self.delay)
        auth = {k.lower(): v for k, v in headers.items()}.get("authorization")
        if self.api_key and auth != f"Bearer {self.api_key}":
            return 401, {"detail": "missing or wrong API key"}, None
        if not isinstance(body, dict):
            return 422, {"detail": "body must be a JSON object"}, None
        body = dict(body)
        questions = body.pop("questions", None)
        if questions is None and "question" in body:
            questions = [body.pop("question")]
        if not isinstance(questions, list) or not questions:
            return 422, {"detail": [{"loc": ["body", "questions"], "msg": "field required"}]}, None
        top_k = body.pop("top_k", None)
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            return 422, {"detail": [{"loc": ["body", "top_k"], "msg": "Input should be greater than or equal to 1"}]}, None
        include_text = body.pop("include_text", False)
        try:
            hits = self.search(questions, top_k=top_k, **body)
        except (TypeError, ValueError) as exc:
            return 400, {"detail": str(exc)}, None
        results = []
        for q, hs in zip(questions, hits):
            rows = []
            for h in hs:
                d = {"id": h.id, "score": h.score, "title": h.title}
                if include_text:
                    d["text"] = h.text
                rows.append(d)
            results.append({"question": q, "hits": rows})
        return 200, {"results": results}, None


@contextmanager
def running(server):
    server.start()
    try:
        yield server
    finally:
        server.stop()


def counting_search(rag, calls: list):
    """rag.search wrapped so that every engine call appends its questions to ``calls``."""
    real = rag.search

    def search(questions, *args, **kwargs):
        calls.append(list(questions) if not isinstance(questions, str) else [questions])
        return real(questions, *args, **kwargs)

    return search
