"""The request and response schemas of a store's routes (serve/store_app.py), with this server's limits, and the
OpenAPI description of their statuses."""
from __future__ import annotations


from typing import Annotated, Optional, Union

from fastapi.encoders import jsonable_encoder
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError, create_model

from . import schemas
from .front import REQUEST_ID_HEADER, HTTPError, HTTPFront
from .schemas import ErrorOut, cut_echo
from .store import NAME_RE

MAX_ID_CHARS = 256


# ---------------------------------------------------------------------------------------------- schemas
def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("a passage's text is blank")
    return text


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not writable as UTF-8 (a lone surrogate)") from None
    return text


def inline_refs(schema: dict) -> dict:
    """A model's JSON Schema with its $defs put in place of their $refs (an OpenAPI request body inlined in an
    operation cannot point at #/$defs)."""
    defs = schema.pop("$defs", {})

    def walk(x):
        if isinstance(x, dict):
            ref = x.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(dict(defs[ref.rsplit("/", 1)[1]]))
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(schema)


def write_models(s) -> tuple:
    """(AddPassages, DeletePassages, CreateIndex): the write and admin bodies with this server's limits."""
    # JSON Schema's integer takes whole floats (-3629.0): schemas._whole makes them ints before the strict check
    PassageId = Annotated[Union[Annotated[StrictInt, Field(ge=-2 ** 63, le=2 ** 63 - 1)],
                                Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_utf8)]],
                          BeforeValidator(schemas._whole)]
    Passage = create_model(
        "PassageIn", __config__=ConfigDict(extra="forbid", strict=True),
        id=(Optional[PassageId], Field(None, description="the passage's id (default: its position in the index); "
                                                         "new to the index (7 and \"7\" are the same id)")),
        title=(Annotated[str, AfterValidator(_utf8)], Field("", max_length=s.max_passage_chars,
                                                             description="the passage's title")),
        text=(Annotated[str, Field(min_length=1, max_length=s.max_passage_chars),
                        AfterValidator(_not_blank), AfterValidator(_utf8)],
              Field(description="the passage's text (not blank)")))
    add = create_model("AddPassages", __config__=ConfigDict(extra="forbid", strict=True),
                       passages=(list[Passage], Field(min_length=1, max_length=s.max_write_passages,
                                                      description="the passages, as the lines of a corpus file")))
    delete = create_model("DeletePassages", __config__=ConfigDict(extra="forbid", strict=True),
                          ids=(list[PassageId], Field(min_length=1, max_length=s.max_write_passages,
                                                      description="ids of passages in the index")))
    create = create_model("CreateIndex", __config__=ConfigDict(extra="forbid", strict=True),
                          name=(Annotated[str, Field(pattern=NAME_RE.pattern)],
                                Field(description="the new index's name (its folder's in the store's folder)")))
    return add, delete, create


class IndexSummary(BaseModel):
    name: str
    status: str = Field(description="loading, ready, failed or unloaded")
    counts: Optional[dict[str, int]] = Field(None, description="passages, sentences, entities, ... (when ready)")
    fingerprint: Optional[str] = None
    error: Optional[str] = Field(None, description="why it failed to load")


class IndexList(BaseModel):
    indexes: list[IndexSummary]


class WriteOut(BaseModel):
    status: str = Field(description="added or deleted")
    index: str
    passages: int = Field(description="passages added or deleted")
    counts: dict[str, int] = Field(description="the index's counts after the write")
    before: dict[str, int] = Field(description="... and before it")
    fingerprint: Optional[str] = Field(description="of the index.json written")
    seconds: float


class DropOut(BaseModel):
    name: str
    status: str


class StoreHealth(BaseModel):
    status: str = Field(description="ok once the indexes given at start have been loaded (or failed to), else "
                                    "loading")


def _validate(model, body):
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors(include_url=False)]
        for e in errors:
            e.pop("ctx", None)
            cut_echo(e)
        raise HTTPError(422, jsonable_encoder(errors), "invalid") from None


def _duplicates(ids: list, field: str) -> None:
    """409 naming the first id given twice (7 and "7" are one id): ids that conflict, as with an id the index holds
    (a schema cannot say which ids are one)."""
    seen = {}
    for i, pid in enumerate(ids):
        if pid is None:
            continue
        if str(pid) in seen:
            loc = ["body", field, i, "id"] if field == "passages" else ["body", field, i]
            raise HTTPError(409, [{"type": "id_conflict", "loc": loc,
                                   "msg": f"id {pid!r} is given twice (first at {seen[str(pid)]})"}], "invalid")
        seen[str(pid)] = i


def _items(schema: dict) -> list:
    """The item schemas of a body schema's list properties."""
    return [p["items"] for p in schema.get("properties", {}).values() if isinstance(p.get("items"), dict)]


class _BodyReader:
    """HTTPFront.read_json (413 past max_body_bytes, 408 past body_timeout, 422 for invalid JSON) for routes of no
    index."""

    read_json = HTTPFront.read_json

    def __init__(self, settings):
        self.settings = settings


# ---------------------------------------------------------------------------------------------- responses
def _responses(s, keys: bool, *codes: str, retry: bool = False) -> dict:
    rid = {REQUEST_ID_HEADER: schemas._header("the request's id (the client's own, or a new one)", {"type": "string"})}
    text = {"400": "bad request", "401": "missing or wrong API key (send 'Authorization: Bearer KEY')",
            "403": "the key's role may not do this", "404": "no such index, or one this key may not see",
            "408": f"the body was not received within {s.body_timeout:g} s",
            "409": "the index's state forbids it: unloaded, being written by another process, exists, no store "
                   "folder; for a write, ids that conflict (an id given twice or already in the index, an id to "
                   "delete not in it, nothing left after a delete: one item per id, naming it; nothing is written)", "413": f"the body is over {s.max_body_bytes} bytes",
            "422": "invalid JSON or a body the schema refuses: one item per field (nothing is written)",
            "429": "overloaded (the index's admission); sent after a short delay",
            "500": "the engine failed (detail names the request id)",
            "503": "the index is loading or failed to load",
            "504": "not answered within the request's deadline"}
    out = {}
    for code in codes:
        if code == "401" and not keys:
            continue
        item = {"model": ErrorOut, "description": text[code], "headers": dict(rid)}
        if code == "401":
            item["headers"]["WWW-Authenticate"] = schemas._header("Bearer", {"type": "string", "const": "Bearer"})
        if code == "429" or (code == "503" and retry):
            item["headers"]["Retry-After"] = schemas._header("seconds to wait before sending again",
                                                             {"type": "integer", "minimum": 1},
                                                             required=code == "429")
        out[code] = item
    return out
