"""count_occurrences (Aho-Corasick) against str.count: non-overlapping, left to right."""
import torch
from hypothesis import example, given, settings, strategies as st

from linearrag_torch.indexing.counting import count_occurrences, count_occurrences_naive


def as_dict(result):
    rows, cols, counts = result
    for t in result:
        assert t.dtype == torch.int64 and t.dim() == 1
    keys = list(zip(rows.tolist(), cols.tolist()))
    assert keys == sorted(keys), "entries must be sorted by (row, col)"
    assert len(set(keys)) == len(keys), "one entry per (row, col)"
    assert all(c > 0 for c in counts.tolist()), "only nonzero counts are stored"
    return dict(zip(keys, counts.tolist()))


def str_count(patterns, texts):
    """The documented semantics, written out: texts[i].count(patterns[j]), empty patterns skipped."""
    return {(i, j): t.count(p) for i, t in enumerate(texts) for j, p in enumerate(patterns) if p and t.count(p)}


def test_overlaps_are_not_counted():
    assert as_dict(count_occurrences(["aa"], ["aaaa", "aaa", "a"])) == {(0, 0): 2, (1, 0): 1}
    assert as_dict(count_occurrences(["aba"], ["ababa", "abababa"])) == {(0, 0): 1, (1, 0): 2}


def test_patterns_that_contain_each_other():
    got = as_dict(count_occurrences(["a", "aa", "aaa", "b"], ["aaaaa"]))
    assert got == {(0, 0): 5, (0, 1): 2, (0, 2): 1}


def test_duplicate_and_empty_patterns():
    got = as_dict(count_occurrences(["ab", "", "ab", "x"], ["abab", "", "xab"]))
    assert got == {(0, 0): 2, (0, 2): 2, (2, 0): 1, (2, 2): 1, (2, 3): 1}


def test_no_patterns_no_texts_and_only_empty_patterns():
    for patterns, texts in (([], ["abc"]), (["a"], []), (["", ""], ["abc"]), ([], [])):
        rows, cols, counts = count_occurrences(patterns, texts)
        assert rows.numel() == cols.numel() == counts.numel() == 0
        assert rows.dtype == cols.dtype == counts.dtype == torch.int64


def test_unicode_counts_characters_not_bytes():
    texts = ["München, münchen", "😀😀😀 x😀", "straße STRASSE", "e\u0301e\u0301"]
    patterns = ["ü", "😀😀", "ß", "\u0301", "é", "München"]
    assert as_dict(count_occurrences(patterns, texts)) == str_count(patterns, texts)


def test_naive_oracle_matches_str_count():
    patterns, texts = ["aa", "", "b"], ["aaab", "bb"]
    assert as_dict(count_occurrences_naive(patterns, texts)) == str_count(patterns, texts) == {
        (0, 0): 1, (0, 2): 1, (1, 2): 2}


ALPHABETS = st.sampled_from(["ab", "abc", "aé😀", "xX ", "\u0301e"])


@st.composite
def cases(draw):
    alphabet = draw(ALPHABETS)
    patterns = draw(st.lists(st.text(alphabet, min_size=0, max_size=4), max_size=8))
    if patterns and draw(st.booleans()):
        patterns.append(draw(st.sampled_from(patterns)))  # duplicate pattern
    texts = draw(st.lists(st.text(alphabet, max_size=30), max_size=6))
    return patterns, texts


@settings(max_examples=300, deadline=None)
@given(cases())
@example((["aa", "a", "aa", ""], ["aaaa", "aaaaa"]))
@example((["aba", "ab", "ba", "b"], ["abababa"]))
@example((["😀😀", "a😀"], ["a😀😀😀a😀"]))
def test_count_occurrences_equals_str_count(case):
    patterns, texts = case
    want = str_count(patterns, texts)
    assert as_dict(count_occurrences(patterns, texts)) == want
    assert as_dict(count_occurrences_naive(patterns, texts)) == want
