"""The HTTP API's request and response schemas (pydantic), with this server's limits in them, and the OpenAPI
description of every route's responses: the document at /openapi.json says what the server does (a client
generated from it is right), and tests/serve/test_openapi_contract.py holds the server to it with schemathesis."""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Annotated, Any, Literal, Optional

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model,
                      model_validator)

from ..config import CROSS_FIELD_RULES, Range, RetrievalConfig
from .settings import ServeSettings

# The numbers a request may set. Each setting's own range is declared once, with its field (config.py, metadata
# "range"), where RetrievalConfig.validate reads it too; the server adds its caps: the most a request may set of the
# integer settings that multiply the engine's work (past int32 the engine's tensors overflow: 2**31 - 1), and
# +-FLOAT_LIMIT for every float (a weight of 1e308 overflows the float32 scores: NaN, which JSON cannot carry).
# The schema states the intersection (request_range), and the request model checks exactly that.
INT32_MAX = 2 ** 31 - 1
REQUEST_MAX = {"max_iterations": 16, "top_k_sentence": 64, "ppr_max_iter": 1000, "chain_passages": 16,
               "chain_sentences": 16, "chain_keep": 16, "chain_rounds": 4, "pair_candidates": 16,
               "rerank_candidates": 50, "rerank_loop_candidates": 50, "rerank_reach": 50, "rerank_pair_tokens": 512,
               "rerank_length_step": 512, "pair_link_max_passages": INT32_MAX, "reset_passages": INT32_MAX,
               "ppr_local_from": INT32_MAX, "ann_probe": 4096}
FLOAT_LIMIT = 1e6
TOP_K = {f.name: f for f in fields(RetrievalConfig)}["top_k"]  # a request's top_k: its range within --max-top-k
# settings only the operator chooses (`linearrag serve --reranker DIR`): a request may not name a folder to load
# or write, nor make the server build an ANN index (`--ann`, `--ann-lists`: minutes per million vectors)
SERVER_ONLY_SETTINGS = ("reranker", "ann", "ann_lists", "ann_cache")
# a question must hold a character that str.strip() keeps: the pattern lists the characters str.isspace() names
# (spelled out: JSON Schema's, Python's and pydantic's regex engines do not agree on what \s is)
SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200b))) + \
    "\u2028\u2029\u202f\u205f\u3000"  # every character of which str.isspace() is true (the contract test checks)
NOT_BLANK = "[^" + "".join(f"\\u{ord(c):04x}" for c in SPACES) + "]"


def _not_blank(q: str) -> str:
    if not q.strip():
        raise ValueError("a question is blank")
    return q


def _whole(value):
    """JSON Schema's integer is any number without a fraction: 3.0 is one (clients and schemathesis send such),
    "3" and true are not (the model is strict)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def request_range(f) -> Range:
    """What a request may set of the numeric setting ``f`` (a field of RetrievalConfig): its own range (config.py)
    within this server's caps (REQUEST_MAX for an integer: KeyError for one without a cap; +-FLOAT_LIMIT for a
    float)."""
    own = f.metadata.get("range") or Range()
    if type(f.default) is int:
        return own.within(None, REQUEST_MAX[f.name])
    return own.within(-FLOAT_LIMIT, FLOAT_LIMIT)


def range_schema(r: Range, typ: type) -> dict:
    """The JSON Schema of the numbers of ``r`` (``typ`` int: "integer", float: "number"): the interval's minimum /
    maximum (exclusive for an open bound), and with values besides it (``also``) an ``anyOf`` of their constants and
    the interval."""
    interval = {"type": "integer" if typ is int else "number"}
    if r.lo is not None:
        interval["exclusiveMinimum" if r.open_lo else "minimum"] = r.lo
    if r.hi is not None:
        interval["exclusiveMaximum" if r.open_hi else "maximum"] = r.hi
    if not r.also:
        return interval
    return {"anyOf": [*({"const": v, "type": interval["type"]} for v in r.also), interval]}


def Number(typ: type, r: Range):  # noqa: N802 (a type)
    """``typ`` (int, taking whole floats as JSON Schema's integer does, or a finite float) in the range ``r``:
    checked by ``r`` itself (the message says the range), its schema from ``range_schema``."""
    text = r.text()

    def inside(value):
        if value not in r:
            raise ValueError(f"must be {text}")
        return value

    checks = [BeforeValidator(_whole)] if typ is int else []
    return Annotated[(typ, *checks, AfterValidator(inside), WithJsonSchema(range_schema(r, typ)))]


def _said(values) -> str:
    return " or ".join(json.dumps(v) for v in values)


def setting_description(f) -> str:
    """A retrieval setting's description in the request schema: the default, and the rules across settings it is
    part of (config.CROSS_FIELD_RULES; the schema states them too, but a request that sets one field of a rule and
    takes the other from the index is checked against the index's settings)."""
    text = "retrieval setting (default: the index's)"
    for refused, why in CROSS_FIELD_RULES:
        if f.name in refused:
            others = " and ".join(f"{k} {_said(vs)}" for k, vs in refused.items() if k != f.name)
            text += (f"; {_said(refused[f.name])} with {others} (this request's, else the index's) is refused "
                     f"(422): {next(iter(refused))} {why}")
    return text


# ---------------------------------------------------------------------------------------------- schemas
class HitOut(BaseModel):
    id: int | str
    score: float
    title: str
    text: Optional[str] = Field(None, description="only when the request set include_text")


class SearchResult(BaseModel):
    question: str
    hits: list[HitOut]


class SearchResponse(BaseModel):
    results: list[SearchResult]


class PassageOut(BaseModel):
    id: int | str | None
    score: float | None
    title: str
    text: Optional[str] = Field(None, description="only when the request set include_text")


class AnswerOut(BaseModel):
    question: str
    answer: str = Field(description="the final answer parsed from the reply")
    reply: str = Field(description="the chat model's whole reply")
    marker_found: bool = Field(description="false: no 'Answer:' line, so answer is the whole reply")
    cached: bool = Field(description="the reply came from the server's cache of replies")
    usage: dict[str, int] = Field(description="token counts of the reply")
    passages: list[PassageOut] = Field(description="the passages shown to the chat model, best first")


class AnswerResponse(BaseModel):
    results: list[AnswerOut]


class ErrorItem(BaseModel):
    """One thing wrong with a request: where (``loc``: "body" or "header", then the field's path) and what."""
    model_config = ConfigDict(extra="allow")
    type: str
    loc: list[str | int]
    msg: str
    input: Any = Field(None, description="the refused value: a long string cut to 80 characters, a list or an "
                                         "object only by its size")


class ErrorOut(BaseModel):
    detail: str | list[ErrorItem] = Field(description="what went wrong: a sentence, or (422) one item per field")


class HealthOut(BaseModel):
    status: Literal["ok", "loading", "failed"]
    fingerprint: Optional[str] = Field(None, description="of the index served (status ok)")
    detail: Optional[str] = Field(None, description="why the index failed to load (status failed)")


class ReloadOut(BaseModel):
    status: Literal["reloaded"]
    fingerprint: Optional[str]
    index: dict[str, Any] = Field(description="the new index's counts")
    seconds: float


def search_request_model(s: ServeSettings) -> type[BaseModel]:
    """The POST /v1/search (and /v1/answer) body, with this server's limits (shown on the OpenAPI page).
    Retrieval settings are the RetrievalConfig fields, as top-level optional fields (null: the index's value);
    anything else is refused. Types are strict: 3 is an integer, "3" and true are not; a float is finite."""
    Question = Annotated[str, Field(min_length=1, max_length=s.max_question_chars), AfterValidator(_not_blank)]
    settings = {}
    for f in fields(RetrievalConfig):
        if f.name == "top_k" or f.name in SERVER_ONLY_SETTINGS:
            continue
        typ = type(f.default)
        if f.metadata.get("choices"):  # mode, question_ner, reranker_precision: an enum in the schema
            typ = Literal[tuple(f.metadata["choices"])]  # type: ignore[valid-type]
        elif typ in (int, float):  # its range (config.py) within the server's caps
            typ = Number(typ, request_range(f))
        settings[f.name] = (Optional[typ], Field(None, description=setting_description(f)))

    def check(self):
        if (self.question is None) == (self.questions is None):
            raise ValueError("give exactly one of 'question' (a string) or 'questions' (a list of strings)")
        overrides = {k: getattr(self, k) for k in settings if getattr(self, k) is not None}
        RetrievalConfig().replace(**overrides)  # its own checks (question_ner needs lexicon_seeds), message names them
        return self

    # question and questions are never null: the schema's oneOf (one of the two, present) is then the whole rule
    return create_model(
        "SearchRequest",
        __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False),
        __validators__={"check": model_validator(mode="after")(check)},
        question=(Question, Field(None, description="one question")),
        questions=(list[Question], Field(None, min_length=1, max_length=s.max_questions,
                                         description="several questions (each as question)")),
        top_k=(Optional[Number(int, TOP_K.metadata["range"].within(None, s.max_top_k))],
               Field(None, description="passages per question (default: the index's)")),
        include_text=(bool, Field(False, description="return each passage's text")),
        **settings,
    )


def request_schema(model: type[BaseModel]) -> dict:
    """The JSON Schema of a request body model as the server applies it: exactly one of question / questions
    (``oneOf``), neither of them null, no blank question, each setting's range (a nested ``anyOf`` flattened), and
    none of the combinations config.CROSS_FIELD_RULES refuses (``not``: no question_ner other than "always" beside
    lexicon_seeds false)."""
    schema = model.model_json_schema()
    props = schema["properties"]
    for name in ("question", "questions"):
        props[name].pop("default", None)
    props["question"]["pattern"] = props["questions"]["items"]["pattern"] = NOT_BLANK
    for prop in props.values():
        if "anyOf" in prop:
            prop["anyOf"] = [y for x in prop["anyOf"] for y in (x["anyOf"] if set(x) == {"anyOf"} else [x])]
    schema["oneOf"] = [{"required": ["question"]}, {"required": ["questions"]}]
    schema["not"] = {"anyOf": [{"required": list(refused),
                                "properties": {k: {"enum": list(vs)} for k, vs in refused.items()}}
                               for refused, _ in CROSS_FIELD_RULES]}
    return schema


# ---------------------------------------------------------------------------------------------- OpenAPI
REQUEST_ID_HEADER = "X-Request-ID"  # a client's own id (printable, at most 64 characters) is kept, else one is made
DEADLINE_HEADER = "X-Request-Timeout"  # seconds the client waits for its answer (at most the server's --timeout)


def _header(description: str, schema: dict, required: bool = True) -> dict:
    return {"description": description, "required": required, "schema": schema}


def request_parameters(s: ServeSettings) -> list[dict]:
    """The headers a search or answer request may send (OpenAPI parameters). X-Request-Timeout is said in the
    operation's description (search_description) rather than as a number parameter: schemathesis' exemption for
    an unknown extra header then fails on the wire string "30" of a declared number header (a false 'accepted
    invalid data'), and its coverage phase sent 5e-324 s, a deadline the queue refuses, beside every body."""
    return [{"name": REQUEST_ID_HEADER, "in": "header", "required": False, "schema": {"type": "string"},
             "description": "the client's id of the request, sent back as X-Request-ID when it is printable ASCII "
                            "of at most 64 characters (else the server makes one)"}]


def search_description(s: ServeSettings) -> str:
    """What the schema cannot say of a search or answer request: the body's size, the deadline header."""
    return (f"Exactly one of `question` or `questions`. The body is at most {s.max_body_bytes} bytes (413) and must "
            f"arrive within {s.body_timeout:g} s (408). Header `{DEADLINE_HEADER}: SECONDS` (a positive number, "
            f"else 422): how long the client waits, at most the server's {s.timeout:g} s (its default); a request "
            "the queue would hold longer gets 429 at once, one not answered within it 504.")


def responses(route: str, s: ServeSettings) -> dict:
    """Every status ``route`` ("search", "answer", "info", "metrics", "reload") can answer besides 200, with its
    body and headers (FastAPI's ``responses``), and the 200's headers; from front.py's code paths."""
    rid = {REQUEST_ID_HEADER: _header("the request's id (the client's own, or a new one)", {"type": "string"})}

    def error(description: str, **headers) -> dict:
        return {"model": ErrorOut, "description": description, "headers": {**rid, **headers}}

    out = {"200": {"description": "OK", "headers": rid}}
    if s.api_key:
        out["401"] = error("missing or wrong API key (send 'Authorization: Bearer KEY')",
                           **{"WWW-Authenticate": _header("Bearer", {"type": "string", "const": "Bearer"})})
    if route == "reload":
        out["409"] = error("the new index was refused (the reason); the old one keeps serving")
    if route not in ("search", "answer"):
        return out
    retry_after = _header("seconds to wait before sending again (from the queue; at least 1)",
                          {"type": "integer", "minimum": 1})
    out.update({
        "408": error(f"the body was not received within {s.body_timeout:g} s"),
        "413": error(f"the body is over {s.max_body_bytes} bytes"),
        "422": error("invalid JSON, a body the schema refuses, or a bad X-Request-Timeout: one item per field"),
        "429": error("overloaded: more than max_concurrent requests in flight, or the queue would hold the request "
                     "past its deadline; sent after a short delay", **{"Retry-After": retry_after}),
        "500": error("the engine failed (detail names the request id, as the server's log does)"),
        "503": {**error("the index is loading or failed to load (with Retry-After)"
                        + "; uvicorn's own 503 (text/plain, no X-Request-ID) past its limit of open connections",
                        **{"Retry-After": {**retry_after, "required": False}}),
                "content": {"text/plain": {"schema": {"type": "string"}}}},
        "504": error(f"not answered within the request's deadline (X-Request-Timeout, at most {s.timeout:g} s)"),
    })
    out["503"]["headers"][REQUEST_ID_HEADER] = {**rid[REQUEST_ID_HEADER], "required": False}
    if route == "answer":
        out["502"] = error("the chat model's endpoint failed (its URL and status)")
    return dict(sorted(out.items()))


ECHO_CHARS = 80  # a 422 shows at most this much of the value it refused


def cut_echo(error: dict) -> None:
    """A validation error names its field (``loc``) and says what is wrong (``msg``); of the value it refused it
    keeps a short one, the first ECHO_CHARS characters of a long string, and of a list or an object only its size
    (a 2,400-character question or 300 questions are not sent back). A string it sends back can be written in
    UTF-8: a lone surrogate (JSON's "\\ud800", which pydantic refuses) is shown as its escape, not a 500."""
    error["loc"] = [_utf8(x) if isinstance(x, str) else x for x in error.get("loc", ())]
    if "input" not in error:
        return
    value = error["input"]
    if isinstance(value, str):
        error["input"] = _utf8(value[:ECHO_CHARS] + f"... ({len(value)} characters)" if len(value) > ECHO_CHARS
                               else value)
    elif isinstance(value, (list, dict)):
        error["input"] = f"({'a list' if isinstance(value, list) else 'an object'} of {len(value)} items)"


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def hit_dict(h, include_text: bool) -> dict:
    d = {"id": h.id, "score": h.score, "title": h.title}
    if include_text:
        d["text"] = h.text
    return d


def explanation_json(e: dict) -> dict:
    """One of LinearRAG.explain's dicts as JSON: each hit as {id, score, title, text, entities}."""
    def plain(x):
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, (str, int, float, bool)) or x is None:
            return x
        if hasattr(x, "id") and hasattr(x, "score"):
            return hit_dict(x, True)
        if hasattr(x, "item"):
            return x.item()
        return str(x)

    out = {k: plain(v) for k, v in e.items() if k != "hits"}
    out["hits"] = [{**hit_dict(h, True), "entities": plain(ents)} for h, ents in e.get("hits", [])]
    return out
