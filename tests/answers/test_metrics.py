"""Answer metrics against hand-computed cases (benchmarks/README.md, "Answer quality")."""
import pytest

from linearrag_torch.answers.scoring import answer_scores, containment, containment_words, exact_match, normalize_answer, recall_at_k, token_f1


@pytest.mark.parametrize("text, norm", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("A  cat,\tan apple", "cat apple"),
    ("theater anthem", "theater anthem"),  # articles only as whole words
    ("Rock 'n' Roll", "rock n roll"),
    ("U.S.A.", "usa"),
    ("", ""),
    ("the a an", ""),
])
def test_normalize(text, norm):
    assert normalize_answer(text) == norm


def test_exact_match():
    assert exact_match("the Beatles", ["Beatles"]) == 1.0
    assert exact_match("Beatles.", ["The Rolling Stones", "beatles"]) == 1.0  # best alias
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match("", ["x"]) == 0.0
    assert exact_match("", [""]) == 1.0
    assert exact_match("x", []) == 0.0  # no alias: nothing to match
    assert exact_match("Paris", "paris") == 1.0  # a bare string is one alias


def test_token_f1_hand_computed():
    assert token_f1("Barack Obama", ["Obama"]) == pytest.approx(2 / 3)  # P 1/2, R 1
    assert token_f1("the cat sat on the mat", ["cat on mat"]) == pytest.approx(6 / 7)  # P 3/4, R 1
    assert token_f1("New York", ["NYC", "New York City"]) == pytest.approx(0.8)  # best alias: P 1, R 2/3
    assert token_f1("paris paris", ["Paris"]) == pytest.approx(2 / 3)  # repeated tokens count once each side
    assert token_f1("Lyon", ["Paris"]) == 0.0
    assert token_f1("", [""]) == 1.0 and token_f1("a an the", ["The"]) == 1.0  # both empty after normalising
    assert token_f1("", ["x"]) == 0.0 and token_f1("x", [""]) == 0.0
    assert token_f1("x", []) == 0.0


def test_containment_edge_cases():
    # the paper's containment: a substring of the normalised prediction
    assert containment("He was born in Paris, France.", ["paris"]) == 1.0
    assert containment("New York City", ["York"]) == 1.0
    assert containment("Yorkshire", ["York"]) == 1.0  # a substring, not a word
    assert containment("Northern Ireland", ["no"]) == 1.0
    assert containment("The Hague", ["the hague"]) == 1.0
    assert containment("anything", [""]) == 0.0 and containment("anything", ["The"]) == 0.0  # empty gold never
    assert containment("", ["x"]) == 0.0
    assert containment("Ernest, Duke of Bavaria", ["Duke of Bavaria", "Ernest"]) == 1.0
    assert containment("Duke of Bavaria", ["Ernest, Duke of Bavaria"]) == 0.0  # gold in prediction, not the reverse
    # the whole-word variant
    assert containment_words("New York City", ["York"]) == 1.0
    assert containment_words("Yorkshire", ["York"]) == 0.0
    assert containment_words("Northern Ireland", ["no"]) == 0.0
    assert containment_words("No, he was not.", ["no"]) == 1.0
    assert containment_words("anything", ["The"]) == 0.0 and containment_words("", ["x"]) == 0.0


def test_recall_at_k():
    assert recall_at_k([1, 2, 3], [3, 4], 2) == 0.0
    assert recall_at_k([1, 2, 3], [3, 4], 3) == 0.5
    assert recall_at_k(["7"], [7], 1) == 1.0  # ids compared as strings
    assert recall_at_k([1], [], 5) is None


def test_answer_scores():
    assert answer_scores("Barack Obama", ["Obama"]) == {"em": 0.0, "f1": pytest.approx(2 / 3), "contains": 1.0,
                                                     "contains_words": 1.0}
