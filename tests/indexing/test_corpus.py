"""read_corpus / read_questions: the documented format, and errors that name the file and the line."""
import json
import re

import pytest

from linearrag_torch.corpus import InputError, Passage, check_question, read_corpus, read_questions


def write(tmp_path, content, name="corpus.jsonl"):
    """Write ``content`` (bytes, or a list of lines: dicts become JSON, strings are written as is)."""
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        lines = [json.dumps(x, ensure_ascii=False) if isinstance(x, dict) else x for x in content]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def error_of(reader, path):
    with pytest.raises(InputError) as info:
        reader(path)
    return str(info.value)


def assert_names(msg, path, line=None):
    assert str(path) in msg, msg
    if line is not None:
        assert re.search(rf"\bline {line}\b", msg), msg
        other = set(re.findall(r"\bline (\d+)\b", msg)) - {str(line)}
        assert not other, f"unexpected line numbers {other} in {msg!r}"


GOOD = {"text": "Paris is in France."}


# ---------------------------------------------------------------- corpus: errors
def test_empty_file(tmp_path):
    path = write(tmp_path, b"")
    msg = error_of(read_corpus, path)
    assert_names(msg, path)
    assert "no passages" in msg


def test_only_blank_lines_is_empty(tmp_path):
    path = write(tmp_path, b"\n  \n\t\n")
    msg = error_of(read_corpus, path)
    assert_names(msg, path)
    assert "no passages" in msg


def test_blank_line_in_the_middle(tmp_path):
    path = write(tmp_path, [GOOD, GOOD | {"id": 5}, "", GOOD | {"id": 6}])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=3)
    assert "blank line" in msg


def test_whitespace_only_line_in_the_middle(tmp_path):
    path = write(tmp_path, [GOOD, "   \t", GOOD | {"id": 7}])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=2)
    assert "blank line" in msg


def test_non_json_line(tmp_path):
    path = write(tmp_path, [GOOD | {"id": "a"}, GOOD | {"id": "b"}, '{"text": "unterminated'])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=3)
    assert "not valid JSON" in msg


@pytest.mark.parametrize("line, kind", [("[1, 2]", "array"), ('"text"', "string"), ("42", "number"),
                                        ("null", "null"), ("true", "boolean")])
def test_json_that_is_not_an_object(tmp_path, line, kind):
    path = write(tmp_path, [GOOD, line])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=2)
    assert "expected a JSON object" in msg and kind in msg


def test_missing_text(tmp_path):
    path = write(tmp_path, [GOOD, GOOD | {"id": 9}, {"id": 10, "title": "no text here"}])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=3)
    assert 'missing field "text"' in msg


@pytest.mark.parametrize("text, kind", [(5, "number"), (None, "null"), (["a"], "array"), ({"a": 1}, "object"),
                                        (True, "boolean")])
def test_text_that_is_not_a_string(tmp_path, text, kind):
    path = write(tmp_path, [GOOD, {"text": text}])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=2)
    assert '"text" must be a string' in msg and kind in msg


def test_title_that_is_not_a_string(tmp_path):
    path = write(tmp_path, [{"text": "x", "title": 3}])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=1)
    assert '"title" must be a string' in msg


@pytest.mark.parametrize("bad_id, kind", [(1.5, "number"), (None, "null"), (True, "boolean"), ([1], "array"),
                                          ({"x": 1}, "object")])
def test_bad_id_type(tmp_path, bad_id, kind):
    path = write(tmp_path, [GOOD, GOOD, GOOD | {"id": bad_id}])
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=3)
    assert '"id" must be an integer or a string' in msg and kind in msg


@pytest.mark.parametrize("first, second", [(7, 7), ("a", "a"), (7, "7")])
def test_duplicate_ids_name_both_lines(tmp_path, first, second):
    path = write(tmp_path, [GOOD | {"id": "x"}, GOOD | {"id": first}, GOOD | {"id": "y"}, GOOD | {"id": second}])
    msg = error_of(read_corpus, path)
    assert str(path) in msg and "duplicate id" in msg
    assert re.search(r"\bline 4\b", msg) and re.search(r"\bline 2\b", msg), msg


def test_default_id_colliding_with_an_explicit_id_is_a_duplicate(tmp_path):
    # line 2 has no id: its id is its position, 1, which line 1 already uses
    path = write(tmp_path, [GOOD | {"id": 1}, GOOD])
    msg = error_of(read_corpus, path)
    assert "duplicate id 1" in msg
    assert re.search(r"\bline 2\b", msg) and re.search(r"\bline 1\b", msg), msg


def test_non_utf8_bytes(tmp_path):
    path = write(tmp_path, b'{"text": "ok"}\n{"text": "caf\xe9"}\n{"text": "fine"}\n')
    msg = error_of(read_corpus, path)
    assert_names(msg, path, line=2)
    assert "UTF-8" in msg


def test_unknown_path(tmp_path):
    path = tmp_path / "nowhere" / "corpus.jsonl"
    msg = error_of(read_corpus, path)
    assert_names(msg, path)
    assert "no such file" in msg


def test_folder_instead_of_file(tmp_path):
    msg = error_of(read_corpus, tmp_path)
    assert_names(msg, tmp_path)
    assert "folder" in msg


def test_errors_are_value_errors(tmp_path):
    # the CLI maps ValueError to exit status 2; InputError must stay one
    with pytest.raises(ValueError):
        read_corpus(write(tmp_path, b""))


# ---------------------------------------------------------------- corpus: good files
def test_default_ids_are_line_positions_and_title_defaults_to_empty(tmp_path):
    path = write(tmp_path, [{"text": "first"}, {"text": "second", "title": "T"}, {"text": "third"}])
    assert read_corpus(path) == [Passage(0, "", "first"), Passage(1, "T", "second"), Passage(2, "", "third")]


def test_int_and_str_ids_are_kept_with_their_type(tmp_path):
    path = write(tmp_path, [{"id": 10, "text": "a"}, {"id": "abc", "text": "b"}, {"text": "c"}, {"id": 0, "text": "d"}])
    got = read_corpus(path)
    assert [p.id for p in got] == [10, "abc", 2, 0]
    assert [type(p.id) for p in got] == [int, str, int, int]
    assert [p.text for p in got] == ["a", "b", "c", "d"]


def test_trailing_blank_lines_extra_fields_and_unicode(tmp_path):
    path = write(tmp_path, b'{"id": "\xc3\xa9", "text": "M\xc3\xbcnchen \xe2\x80\xa8 ok", "extra": [1]}\n\n  \n')
    assert read_corpus(path) == [Passage("é", "", "München \u2028 ok")]


def test_crlf_line_endings_and_byte_order_mark(tmp_path):
    path = write(tmp_path, b'\xef\xbb\xbf{"text": "a"}\r\n{"text": "b", "title": "B"}\r\n')
    assert read_corpus(path) == [Passage(0, "", "a"), Passage(1, "B", "b")]


def test_empty_text_is_allowed(tmp_path):
    # only the type is checked for passages: an empty text is a valid (useless) passage
    assert read_corpus(write(tmp_path, [{"text": ""}])) == [Passage(0, "", "")]


def test_string_path_is_accepted(tmp_path):
    path = write(tmp_path, [GOOD])
    assert read_corpus(str(path)) == [Passage(0, "", GOOD["text"])]


# ---------------------------------------------------------------- questions
def test_questions_keep_other_fields_and_default_ids(tmp_path):
    path = write(tmp_path, [{"question": "Who?", "answers": ["x"]}, {"question": "Where?", "id": "q2"}],
                 name="q.jsonl")
    assert read_questions(path) == [{"question": "Who?", "answers": ["x"], "id": 0}, {"question": "Where?", "id": "q2"}]


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_empty_or_blank_question_is_rejected(tmp_path, question):
    path = write(tmp_path, [{"question": "Who?"}, {"question": question}], name="q.jsonl")
    msg = error_of(read_questions, path)
    assert_names(msg, path, line=2)
    assert "empty" in msg


def test_missing_question_field(tmp_path):
    path = write(tmp_path, [{"question": "Who?"}, {"text": "not a question"}], name="q.jsonl")
    msg = error_of(read_questions, path)
    assert_names(msg, path, line=2)
    assert 'missing field "question"' in msg


def test_question_that_is_not_a_string(tmp_path):
    path = write(tmp_path, [{"question": ["Who?"]}], name="q.jsonl")
    msg = error_of(read_questions, path)
    assert_names(msg, path, line=1)
    assert '"question" must be a string' in msg


def test_question_file_errors_share_the_line_numbering(tmp_path):
    path = write(tmp_path, [{"question": "a", "id": 1}, {"question": "b", "id": 1}], name="q.jsonl")
    msg = error_of(read_questions, path)
    assert "duplicate id 1" in msg and re.search(r"\bline 2\b", msg) and re.search(r"\bline 1\b", msg)
    path = write(tmp_path, b'{"question": "a"}\n\xff\n', name="q2.jsonl")
    assert_names(error_of(read_questions, path), path, line=2)
    path = write(tmp_path, ['{"question": "a"}', "", '{"question": "b"}'], name="q3.jsonl")
    assert_names(error_of(read_questions, path), path, line=2)


def test_empty_question_file(tmp_path):
    path = write(tmp_path, b"\n", name="q.jsonl")
    msg = error_of(read_questions, path)
    assert_names(msg, path)
    assert "no questions" in msg


def test_check_question():
    assert check_question("Who?") == "Who?"
    for bad in ("", "  \n"):
        with pytest.raises(ValueError, match="empty question"):
            check_question(bad)
    with pytest.raises(TypeError):
        check_question(None)
