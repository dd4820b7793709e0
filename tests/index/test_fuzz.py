"""Property-based tests: arbitrary unicode, control characters, long lines, empty strings and malformed
JSON thrown at the corpus reader, at `linearrag add/delete/index`, at add/delete themselves and at the
index loader. Each must give a correct result or a clear error, and a failure never changes an index.
"""
import json

import pytest
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from linearrag_torch import InputError, Passage
from linearrag_torch.indexing.build import add_passages, build_index, delete_passages
from linearrag_torch.cli import main
from linearrag_torch.corpus import read_corpus
from linearrag_torch.index import IndexFormatError, TriGraphIndex

from test_index_io import sample_index
from test_updates import assert_same_graph, one_thread, shared_models, snapshot  # noqa: F401 (fixtures)

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
# any unicode but lone surrogates (which no UTF-8 file can hold); control characters, line and paragraph
# separators, NUL, RTL marks and emoji included
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
WORDS = st.sampled_from(["Paris", "France", "Victor Hugo", "the", "capital", "of", "is", "born", "in", "1802",
                         "Marie Curie", "Warsaw", "PARIS", "Zürich", "東京", "\n", ".", "\t", "\x00", "\u2028", " "])
WORDY_TEXT = st.lists(st.one_of(WORDS, ANY_TEXT.map(lambda s: s[:12])), max_size=30).map(" ".join)
IDS = st.one_of(st.integers(min_value=-10**12, max_value=10**12), ANY_TEXT.map(lambda s: s[:20]))
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), ANY_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT.map(lambda s: s[:8]), inner, max_size=4)),
    max_leaves=8,
)


# ---------------------------------------------------------------- the corpus reader
@settings(max_examples=150, **SETTINGS)
@given(st.lists(st.one_of(st.binary(max_size=80), ANY_TEXT.map(str.encode), JSON.map(lambda o: json.dumps(o).encode()),
                          st.builds(lambda t, i: json.dumps({"id": i, "text": t}).encode(), ANY_TEXT, IDS)),
                max_size=6))
@example([b'{"text": "a"}', b'{"text": "\\ud800"}'])  # a lone surrogate, written as a JSON escape
@example([b'{"text": "a", "id": 1}', b'{"text": "b", "id": "1"}'])
@example([b"\xff\xfe{"])
def test_corpus_reader_gives_passages_or_an_error_naming_the_file(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fuzz") / "c.jsonl"
    path.write_bytes(b"\n".join(lines))
    try:
        passages = read_corpus(path)
    except InputError as exc:
        assert str(path) in str(exc)
        return
    assert passages and all(isinstance(p.text, str) and isinstance(p.title, str) for p in passages)
    assert len({str(p.id) for p in passages}) == len(passages)
    for p in passages:
        for s in (p.text, p.title, str(p.id)):
            s.encode("utf-8")  # every string can be saved


@settings(max_examples=80, **SETTINGS)
@given(st.lists(st.fixed_dictionaries({"text": st.one_of(ANY_TEXT, WORDY_TEXT)},
                                      optional={"title": ANY_TEXT, "extra": JSON}), min_size=1, max_size=5),
       st.booleans(), st.booleans())
@example([{"text": "x" * 100_000}, {"text": ""}, {"text": "\r\n\x00\x1c\u2028\u2029\x85"}], False, True)
def test_corpus_reader_round_trips_any_text(tmp_path_factory, objs, ascii_only, crlf):
    path = tmp_path_factory.mktemp("fuzz") / "c.jsonl"
    end = "\r\n" if crlf else "\n"
    path.write_text("".join(json.dumps(o, ensure_ascii=ascii_only) + end for o in objs), encoding="utf-8")
    got = read_corpus(path)
    assert got == [Passage(i, o.get("title", ""), o["text"]) for i, o in enumerate(objs)]


# ---------------------------------------------------------------- add and delete on arbitrary text
@pytest.fixture(scope="module")
def base_passages():
    return [Passage("b0", "Victor Hugo", "Victor Hugo was born in Besançon, France. He died in Paris."),
            Passage("b1", "", "Marie Curie was born in Warsaw. She worked in Paris.")]


@pytest.fixture(scope="module")
def base_index(base_passages, nlp, encoder):
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # see test_updates.one_thread
    try:
        return build_index(base_passages, nlp=nlp, encoder=encoder, progress=False)
    finally:
        torch.set_num_threads(n)


@settings(max_examples=8, **SETTINGS)
@given(st.lists(st.tuples(st.one_of(WORDY_TEXT, ANY_TEXT), st.one_of(st.just(""), WORDY_TEXT.map(lambda s: s[:40]))),
                min_size=1, max_size=3),
       st.randoms(use_true_random=False))
@example([("Paris is the capital of France. Victor Hugo lived in Paris.", "Paris"),
          ("Victor Hugo was born in Besançon, France. He died in Paris.", "Victor Hugo"),  # = b0
          ("PARIS\x00 \u2028 Zürich\n\nMarie Curie.", "")], __import__("random").Random(0))
def test_add_and_delete_of_arbitrary_text_equal_fresh_builds(base_index, base_passages, nlp, encoder, one_thread,
                                                             new, rnd):
    added = [Passage(f"n{i}", title, text) for i, (text, title) in enumerate(new)]
    everything = base_passages + added
    grown = add_passages(base_index, added, nlp=nlp, encoder=encoder, progress=False)
    assert_same_graph(grown, build_index(everything, nlp=nlp, encoder=encoder, progress=False))
    gone = rnd.sample([p.id for p in everything], rnd.randint(1, len(everything) - 1))
    rest = [p for p in everything if p.id not in gone]
    assert_same_graph(delete_passages(grown, gone), build_index(rest, nlp=nlp, encoder=encoder, progress=False))


# ---------------------------------------------------------------- the command line on bad input
GOOD_LINE = st.builds(lambda i, t: json.dumps({"id": f"new-{i}", "text": t}, ensure_ascii=False).encode(),
                      st.integers(0, 10**6), ANY_TEXT)
TAKEN = b'{"text": "taken", "id": "b1"}'
BAD_LINE = st.one_of(
    st.binary(max_size=40).filter(lambda b: b.strip() and not b.strip().startswith(b"{")),  # not JSON / not an object
    st.just(b"\xff\xfe not utf-8"),
    JSON.filter(lambda o: not isinstance(o, dict)).map(lambda o: json.dumps(o).encode()),  # JSON, not an object
    st.dictionaries(st.sampled_from(["id", "title", "txt"]), JSON, max_size=3).map(lambda o: json.dumps(o).encode()),  # no text
    st.builds(lambda t: json.dumps({"text": t}).encode(), JSON.filter(lambda t: not isinstance(t, str))),
    st.builds(lambda t: json.dumps({"text": "x", "title": t}).encode(), JSON.filter(lambda t: not isinstance(t, str))),
    st.builds(lambda i: json.dumps({"text": "x", "id": i}).encode(), JSON.filter(lambda i: isinstance(i, (bool, float, list, dict)) or i is None)),
    st.just(b'{"text": "lone \\udc80 surrogate", "id": "s"}'),
    st.just(TAKEN),  # an id of the index
    st.just(b'{"text": "' + b"long line " * 5000 + b'}'),  # unterminated string in a long line
)


@pytest.fixture(scope="module")
def index_dir(base_index, tmp_path_factory):
    return base_index.save(tmp_path_factory.mktemp("fuzz_index") / "idx")


@settings(max_examples=60, **SETTINGS)
@given(st.lists(GOOD_LINE, max_size=3), BAD_LINE, st.lists(st.one_of(GOOD_LINE, BAD_LINE, st.just(b"")), max_size=3),
       st.sampled_from(["add", "index"]))
def test_cli_refuses_bad_files_and_leaves_the_index_unchanged(shared_models, index_dir, tmp_path_factory, capsys,
                                                              before, bad, after, command):
    if command == "index":  # an id of the index is no error for a new build
        assume(TAKEN not in [bad] + after)
    path = tmp_path_factory.mktemp("fuzz") / "more.jsonl"
    path.write_bytes(b"\n".join(before + [bad] + after + [b'{"text": "last", "id": "last"}']))
    files = snapshot(index_dir)
    argv = ["add", index_dir, path] if command == "add" else ["index", path, index_dir]
    capsys.readouterr()
    rc = main([str(a) for a in argv + ["--quiet", "--device", "cpu"]])
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.startswith(f"linearrag {command}: error: {path}") and err.count("\n") == 1, err
    assert snapshot(index_dir) == files


@settings(max_examples=40, **SETTINGS)
@given(st.lists(ANY_TEXT.filter(lambda s: "," not in s and s.strip()), min_size=1, max_size=3))
def test_cli_delete_of_unknown_ids_changes_nothing(index_dir, capsys, ids):
    assume(not {s.strip() for s in ids} & {"b0", "b1"})
    files = snapshot(index_dir)
    capsys.readouterr()
    assert main(["delete", str(index_dir), "--ids=" + ",".join(ids)]) == 2
    assert capsys.readouterr().err.startswith("linearrag delete: error: no passage with id ")
    assert snapshot(index_dir) == files


# ---------------------------------------------------------------- the loader
def _json_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _json_paths(v, prefix + (i,))


def _set(obj, path, value):
    if not path:
        return value
    obj[path[0]] = _set(obj[path[0]], path[1:], value)
    return obj


def assert_loads_or_refuses(path, verify=True):
    try:
        ix = TriGraphIndex.load(path, verify=verify)
    except IndexFormatError as exc:
        assert str(exc)
        return None
    ix.validate()
    return ix


@settings(max_examples=80, **SETTINGS)
@given(st.data(), JSON, st.sampled_from(["index.json", "strings"]))
def test_loader_refuses_any_changed_json_clearly(tmp_path_factory, data, value, target):
    """A field of index.json or of the strings file replaced by any JSON value (the manifest updated, so
    that the content itself is checked): IndexFormatError or an index that validates, never a crash."""
    import hashlib

    path = sample_index(passages=6, entities=5, dim=4).save(tmp_path_factory.mktemp("load") / "idx")
    meta = json.loads((path / "index.json").read_text())
    name = "index.json" if target == "index.json" else meta["files"]["strings"]
    obj = json.loads((path / name).read_text(encoding="utf-8"))
    where = data.draw(st.sampled_from(list(_json_paths(obj))))
    changed = json.dumps(_set(obj, where, value), ensure_ascii=False).encode()
    (path / name).write_bytes(changed)
    if target != "index.json":
        meta["manifest"][name] = {"bytes": len(changed), "sha256": hashlib.sha256(changed).hexdigest()}
        (path / "index.json").write_text(json.dumps(meta))
    assert_loads_or_refuses(path)


@settings(max_examples=60, **SETTINGS)
@given(st.sampled_from(["index.json", "tensors", "strings"]), st.integers(0, 10**9), st.binary(max_size=16),
       st.sampled_from(["truncate", "overwrite", "append", "replace"]), st.booleans())
def test_loader_refuses_damaged_files_clearly(tmp_path_factory, target, at, junk, how, verify):
    path = sample_index(passages=6, entities=5, dim=4).save(tmp_path_factory.mktemp("load") / "idx")
    meta = json.loads((path / "index.json").read_text())
    f = path / ("index.json" if target == "index.json" else meta["files"][target])
    raw = f.read_bytes()
    at %= len(raw) + 1
    new = {"truncate": raw[:at], "overwrite": raw[:at] + junk + raw[at + len(junk):],
           "append": raw + junk, "replace": junk}[how]
    assume(new != raw)
    f.write_bytes(new)
    ix = assert_loads_or_refuses(path, verify=verify)
    if verify and target != "index.json":
        assert ix is None  # the manifest catches every change of a data file
