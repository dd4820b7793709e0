"""One source for each limit (issue 63, the contract): a request's retrieval settings take the ranges declared once
with their fields (config.py, ``_f(..., range=Range(...), choices=...)``, which RetrievalConfig.validate reads) within
the server's caps (serve/schemas.py), and the request schema states exactly what the server's validator takes.

The cases come from the schema, not from a table of limits kept here: for every setting a request can send, each
bound the schema states, one past it either way, each constant and choice and a value no choice is, and values of
other types; the body schema (jsonschema, as the OpenAPI document publishes it) and the request model (what the
server runs, RetrievalConfig.validate inside) must agree on each. The other way round, values drawn by hypothesis
from wide ranges (not from the schema) must be taken by the validator exactly when the schema takes them, so that a
check written in the validator alone is found too.
"""
from __future__ import annotations

import copy
import math
from dataclasses import fields

import pytest

pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from linearrag_torch.config import CROSS_FIELD_RULES, Range, RetrievalConfig  # noqa: E402
from linearrag_torch.serve import ServeSettings  # noqa: E402
from linearrag_torch.serve.schemas import request_schema, search_request_model  # noqa: E402

SERVE = ServeSettings(max_top_k=8)
MODEL = search_request_model(SERVE)
SCHEMA = request_schema(MODEL)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)  # OpenAPI 3.1's dialect
FIELDS = {f.name: f for f in fields(RetrievalConfig)}
# every retrieval setting a request can send (the operator's own are not in the schema)
SETTINGS = [name for name in SCHEMA["properties"] if name in FIELDS]


def alternatives(prop: dict) -> list:
    """The non-null schemas a property's value may match."""
    return [a for a in prop.get("anyOf", [prop]) if a.get("type") != "null"]


def _around(bound, integer: bool) -> list:
    if integer:
        return [bound - 1, bound, bound + 1, float(bound), bound + 0.5]
    return [bound, math.nextafter(bound, -math.inf), math.nextafter(bound, math.inf), bound - 1, bound + 1]


def boundary_values(prop: dict) -> list:
    """Values at and around every limit the schema states for one property, and values of other types."""
    out = [None, True, False, "1", [1], {"a": 1}, 0, 1, -1, 0.5, 2 ** 63]
    for alt in alternatives(prop):
        integer = alt.get("type") == "integer"
        if "enum" in alt:
            out += [*alt["enum"], alt["enum"][0] + "x", alt["enum"][0].upper(), ""]
        if "const" in alt and not isinstance(alt["const"], bool):
            out += _around(alt["const"], integer)
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if key in alt:
                out += _around(alt[key], integer)
    seen, unique = set(), []
    for v in out:
        key = (type(v).__name__, repr(v))
        if key not in seen:
            seen.add(key)
            unique.append(v)
    return unique


def server_takes(body: dict) -> bool:
    try:
        MODEL.model_validate(body)
    except ValidationError:
        return False
    return True


def agree(body: dict) -> None:
    schema, server = VALIDATOR.is_valid(body), server_takes(body)
    assert schema == server, f"{body}: the schema {'takes' if schema else 'refuses'} it, the server " \
                             f"{'takes' if server else 'refuses'} it"


def test_every_setting_a_request_sends_is_in_the_schema_with_its_limits():
    """Each of them has its limits stated: a range (numbers), an enum (choices) or a type with no limit (booleans)."""
    assert "top_k" in SETTINGS and "rerank_pair_tokens" in SETTINGS and len(SETTINGS) > 30
    for name in SETTINGS:
        f = FIELDS[name]
        alts = alternatives(SCHEMA["properties"][name])
        if f.metadata.get("choices"):
            assert [a["enum"] for a in alts] == [list(f.metadata["choices"])], name
        elif isinstance(f.default, bool):
            assert alts == [{"type": "boolean"}], name
        elif isinstance(f.default, (int, float)):
            interval = alts[-1]
            assert {"minimum", "exclusiveMinimum"} & set(interval), name  # every number is bounded below ...
            assert {"maximum", "exclusiveMaximum"} & set(interval), name  # ... and above (the server's caps)
            assert [a["const"] for a in alts[:-1]] == list(f.metadata.get("range", Range()).also), name


@pytest.mark.parametrize("name", SETTINGS)
def test_the_schema_and_the_validator_agree_on_each_bound(name):
    """Each bound the schema states, one past it, the constants, the choices and a non-choice, other types: the
    server takes exactly what the schema takes (rerank_pair_tokens 14 was allowed by the schema and refused)."""
    values = boundary_values(SCHEMA["properties"][name])
    for value in values:
        agree({"question": "Who?", name: value})
    taken = [v for v in values if VALIDATOR.is_valid({"question": "Who?", name: v})]
    assert None in taken and len(taken) >= 2, (name, taken)  # not agreement on refusing everything


def test_the_rules_across_settings_agree():
    """config.CROSS_FIELD_RULES (question_ner other than "always" beside lexicon_seeds false): the schema's "not"
    and the validator refuse the same bodies, each field set, unset or null."""
    for refused, _ in CROSS_FIELD_RULES:
        (a, a_values), (b, b_values) = list(refused.items())[:2]
        a_all = [*alternatives(SCHEMA["properties"][a])[0].get("enum", list(a_values)), None, "missing"]
        b_all = [True, False, None, "missing"] if isinstance(FIELDS[b].default, bool) else [*b_values, None, "missing"]
        for x in a_all:
            for y in b_all:
                body = {"question": "Who?", **({} if x == "missing" else {a: x}), **({} if y == "missing" else {b: y})}
                agree(body)
        assert not VALIDATOR.is_valid({"question": "Who?", a: a_values[0], b: b_values[0]})


def _number_of(name):
    f = FIELDS[name]
    if isinstance(f.default, bool) or not isinstance(f.default, (int, float)):
        return st.nothing()
    wide = st.integers(-2 ** 33, 2 ** 33) | st.integers(-600, 600)
    return wide if isinstance(f.default, int) else wide | st.floats(-2e6, 2e6, allow_nan=False)


NUMERIC = [n for n in SETTINGS if isinstance(FIELDS[n].default, (int, float)) and not isinstance(FIELDS[n].default, bool)]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(NUMERIC).flatmap(lambda n: st.tuples(st.just(n), _number_of(n))))
def test_values_the_schema_did_not_suggest_agree_too(case):
    """The other way round: numbers drawn from wide ranges, not from the schema's bounds; a limit the validator
    checks and the schema does not state (or the reverse) shows here."""
    name, value = case
    agree({"question": "Who?", name: value})


def test_the_config_and_its_ranges_agree():
    """RetrievalConfig itself (the CLI's and the Python API's validator) refuses a value exactly when its field's
    range (or choices) does, at the range's own bounds (no server caps), one past each and the constants."""
    for f in fields(RetrievalConfig):
        r, choices = f.metadata.get("range"), f.metadata.get("choices")
        if r is not None:
            integer = isinstance(f.default, int)
            values = [*(v for b in (r.lo, r.hi) if b is not None for v in _around(b, True)[:3]), *r.also]
            if not integer:
                values += [v for b in (r.lo, r.hi) if b is not None for v in _around(b, False)]
            checks = [(v, v in r) for v in values]
        elif choices:
            checks = [(c, True) for c in choices] + [(choices[0] + "x", False)]
        else:
            continue
        for value, ok in checks:
            try:
                RetrievalConfig(**{f.name: value})
            except ValueError as exc:
                assert not ok, (f.name, value, exc)
                assert f.name in str(exc)
            else:
                assert ok, (f.name, value)


def test_a_setting_the_index_makes_invalid_is_a_422_naming_it(small_rag):
    """A rule across settings with one field from the request and the other from the index (question_ner "off" on
    an index of lexicon_seeds false) cannot be in a schema made before the index: the server checks the request
    against the index's settings and answers 422 naming the field (it was the engine's 500), as the field's
    description in the schema says."""
    httpx = pytest.importorskip("httpx")
    from test_serve import TIMEOUT, serving

    assert "lexicon_seeds false (this request's, else the index's) is refused (422)" in \
        SCHEMA["properties"]["question_ner"]["description"]
    rag = copy.copy(small_rag)
    rag.config = small_rag.config.replace(lexicon_seeds=False, question_ner="always")
    with serving(rag) as (url, _):
        def post(**body):
            return httpx.post(url + "/v1/search", json={"question": "Who directed Cocktail?", **body}, timeout=TIMEOUT)

        r = post(question_ner="off")
        assert r.status_code == 422, r.text
        (item,) = r.json()["detail"]
        assert item["loc"] == ["body", "question_ner"] and "lexicon_seeds" in item["msg"]
        assert post(question_ner="off", lexicon_seeds=True).status_code == 200
        assert post().status_code == 200 and post(lexicon_seeds=False).status_code == 200
