"""The HTTP API's request and response schemas (pydantic), with this server's limits in them."""
from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from ..config import MODES, RetrievalConfig
from .settings import ServeSettings

# upper bounds a client may set for the settings that multiply the engine's work
SETTING_BOUNDS = {"max_iterations": (1, 16), "top_k_sentence": (1, 64), "ppr_max_iter": (1, 1000),
                  "chain_passages": (0, 16), "chain_sentences": (1, 16), "chain_keep": (0, 16), "chain_rounds": (1, 4),
                  "pair_candidates": (0, 16), "rerank_candidates": (1, 50)}
# settings only the operator chooses (`linearrag serve --reranker DIR`): a request may not name a folder to load
SERVER_ONLY_SETTINGS = ("reranker",)


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


def search_request_model(s: ServeSettings) -> type[BaseModel]:
    """The POST /v1/search body, with this server's limits (shown on the OpenAPI page). Retrieval settings
    are the RetrievalConfig fields, as top-level optional fields; anything else is refused."""
    Question = Annotated[str, Field(min_length=1, max_length=s.max_question_chars)]
    settings = {}
    for f in fields(RetrievalConfig):
        if f.name == "top_k" or f.name in SERVER_ONLY_SETTINGS:
            continue
        typ = type(f.default)
        if f.name == "mode":
            typ = Literal[MODES]  # type: ignore[valid-type]
        lo_hi = SETTING_BOUNDS.get(f.name)
        extra = {"ge": lo_hi[0], "le": lo_hi[1]} if lo_hi else {}
        settings[f.name] = (Optional[typ], Field(None, description=f"retrieval setting (default: the index's)", **extra))

    def check(self):
        if (self.question is None) == (self.questions is None):
            raise ValueError("give exactly one of 'question' (a string) or 'questions' (a list of strings)")
        for q in self.questions or [self.question]:
            if not q.strip():
                raise ValueError("a question is blank")
        overrides = {k: getattr(self, k) for k in settings if getattr(self, k) is not None}
        RetrievalConfig().replace(**overrides)  # its own checks (damping in (0, 1), ...), message names the field
        return self

    return create_model(
        "SearchRequest",
        __config__=ConfigDict(extra="forbid", strict=False),
        __validators__={"check": model_validator(mode="after")(check)},
        question=(Optional[Question], Field(None, description="one question")),
        questions=(Optional[list[Question]], Field(None, min_length=1, max_length=s.max_questions,
                                                   description="several questions")),
        top_k=(Optional[int], Field(None, ge=1, le=s.max_top_k, description="passages per question")),
        include_text=(bool, Field(False, description="return each passage's text")),
        **settings,
    )


ECHO_CHARS = 80  # a 422 shows at most this much of the value it refused


def cut_echo(error: dict) -> None:
    """A validation error names its field (``loc``) and says what is wrong (``msg``); of the value it refused it
    keeps a short one, the first ECHO_CHARS characters of a long string, and of a list or an object only its size
    (a 2,400-character question or 300 questions are not sent back)."""
    if "input" not in error:
        return
    value = error["input"]
    if isinstance(value, str) and len(value) > ECHO_CHARS:
        error["input"] = value[:ECHO_CHARS] + f"... ({len(value)} characters)"
    elif isinstance(value, (list, dict)):
        error["input"] = f"({'a list' if isinstance(value, list) else 'an object'} of {len(value)} items)"


def hit_dict(h, include_text: bool) -> dict:
    d = {"id": h.id, "score": h.score, "title": h.title}
    if include_text:
        d["text"] = h.text
    return d
