"""The HTTP API's request and response schemas (pydantic), with this server's limits in them, and the OpenAPI
description of every route's responses: the document at /openapi.json says what the server does (a client
generated from it is right), and tests/serve/test_openapi_contract.py holds the server to it with schemathesis."""
from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model, model_validator

from ..config import QUESTION_NER, RetrievalConfig
from .settings import ServeSettings

# upper bounds a client may set for the settings that multiply the engine's work
SETTING_BOUNDS = {"max_iterations": (1, 16), "top_k_sentence": (1, 64), "ppr_max_iter": (1, 1000),
                  "chain_passages": (0, 16), "chain_sentences": (1, 16), "chain_keep": (0, 16), "chain_rounds": (1, 4),
                  "pair_candidates": (0, 16), "rerank_candidates": (1, 50), "rerank_loop_candidates": (0, 50),
                  "rerank_reach": (0, 50), "rerank_pair_tokens": (0, 512), "rerank_length_step": (0, 512),
                  "pair_link_max_passages": (1, 2 ** 31 - 1),  # (past int32 the engine's tensors overflow: 500)
                  "reset_passages": (0, 2 ** 31 - 1), "ppr_local_from": (0, 2 ** 31 - 1), "ann_probe": (1, 4096)}
# the float settings: RetrievalConfig.validate's own bounds, as pydantic (and JSON Schema) constraints, so that
# the OpenAPI document says them; every other float lies within +-FLOAT_LIMIT (a weight of 1e308 overflows the
# float32 scores: NaN, which JSON cannot carry) and is finite
FLOAT_LIMIT = 1e6
FLOAT_BOUNDS = {"damping": {"gt": 0.0, "lt": 1.0}, "ppr_tol": {"gt": 0.0, "le": FLOAT_LIMIT},
                "ppr_eps": {"gt": 0.0, "le": FLOAT_LIMIT},
                "chain_weight": {"ge": 0.0, "le": FLOAT_LIMIT}, "chain_passage_weight": {"ge": 0.0, "le": FLOAT_LIMIT},
                "pair_rank_weight": {"ge": 0.0, "le": FLOAT_LIMIT}, "pair_link_weight": {"ge": 0.0, "le": FLOAT_LIMIT},
                "chain_prior_floor": {"ge": -1.0, "le": 1.0}}
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


def Int(lo: int | None = None, hi: int | None = None):  # noqa: N802 (a type)
    """An integer in [lo, hi] (its bounds inside, where the JSON Schema shows them), whole floats taken."""
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(_whole)]


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
        extra = {}
        if f.metadata.get("choices"):  # mode, question_ner, reranker_precision: an enum in the schema
            typ = Literal[tuple(f.metadata["choices"])]  # type: ignore[valid-type]
        elif typ is int:
            typ = Int(*SETTING_BOUNDS[f.name])  # every integer setting has its bounds (KeyError: give it some)
        elif typ is float:
            extra = FLOAT_BOUNDS.get(f.name, {"ge": -FLOAT_LIMIT, "le": FLOAT_LIMIT})
        settings[f.name] = (Optional[typ], Field(None, description="retrieval setting (default: the index's)", **extra))

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
        top_k=(Optional[Int(1, s.max_top_k)], Field(None, description="passages per question (default: the "
                                                                           "index's)")),
        include_text=(bool, Field(False, description="return each passage's text")),
        **settings,
    )


def request_schema(model: type[BaseModel]) -> dict:
    """The JSON Schema of a request body model as the server applies it: exactly one of question / questions
    (``oneOf``), neither of them null, no blank question, and no question_ner other than "always" beside
    lexicon_seeds false (RetrievalConfig.validate)."""
    schema = model.model_json_schema()
    props = schema["properties"]
    for name in ("question", "questions"):
        props[name].pop("default", None)
    props["question"]["pattern"] = props["questions"]["items"]["pattern"] = NOT_BLANK
    schema["oneOf"] = [{"required": ["question"]}, {"required": ["questions"]}]
    others = [q for q in QUESTION_NER if q != "always"]
    schema["not"] = {"required": ["question_ner", "lexicon_seeds"],
                     "properties": {"question_ner": {"enum": others}, "lexicon_seeds": {"const": False}}}
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
