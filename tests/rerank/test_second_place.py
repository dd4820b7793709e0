"""Training the second place (rerank/second_place.py, `linearrag train-reranker --second-place`): the first hop,
the reader's mistakes after it (against a stand-in reader whose logits are set by hand), the training group, and
a tiny run end to end."""
import pytest
import torch

from conftest import write_jsonl
from linearrag_torch.rerank.scoring import PassageTokens, QuestionTokens
from linearrag_torch.rerank.second_place import (SecondPlace, first_hop, mine_second_place, second_place_counts,
                                                 second_place_group)
from linearrag_torch.rerank.train import TrainConfig, TrainingQuestion, read_training_file, train
from linearrag_torch.models.reranker import RerankerSettings

PASSAGES = {"a": ("Move (1970 film)", "..."), "b": ("Stuart Rosenberg", "..."), "c": ("Paris", "..."),
            "d": ("The Film Move", "...")}


def test_the_first_hop_is_the_gold_passage_the_question_names_first():
    q = "Who directed Move (1970 Film), and was Stuart Rosenberg American?"
    assert first_hop(q, ["b", "a"], PASSAGES) == "a"  # named at position 13, before "Stuart Rosenberg"
    assert first_hop("Was Stuart Rosenberg in Move (1970 film)?", ["a", "b"], PASSAGES) == "b"
    # none named: the most title words shared with the question, ties the first listed
    assert first_hop("Which film called Move won?", ["b", "d"], PASSAGES) == "d"
    assert first_hop("Who is he?", ["c", "b"], PASSAGES) == "c"


class FirstTokenReader(torch.nn.Module):
    """A stand-in reader: a pair's logit is set by hand for its passage, found by the passage's first token (the
    first position of token type 1), plus a bonus set by hand for a (context, passage) pair (the context's first
    token sits right after the question's [SEP])."""

    def __init__(self, logit_of_token: dict, context_bonus: dict | None = None):
        super().__init__()
        self.logit_of_token, self.context_bonus = logit_of_token, context_bonus or {}

    def forward(self, ids, mask, types):
        first = types.argmax(1)
        out = []
        for row, at in zip(ids.tolist(), first.tolist()):
            out.append(self.logit_of_token[row[at]] + self.context_bonus.get((row[3], row[at]), 0.0))
        return torch.tensor(out)


def _tokens():
    # questions: [CLS] w [SEP] (3 tokens); passages: one distinct token each (rows 0..5 -> tokens 10..15)
    q = QuestionTokens(torch.tensor([[101, 1, 102], [101, 2, 102]]), torch.tensor([3, 3]))
    p = PassageTokens(torch.tensor([[10 + i, 50] for i in range(6)]), torch.tensor([2] * 6))
    return q, p


def test_mining_counts_the_paragraphs_above_the_weakest_gold_second_hop():
    q_tok, p_tok = _tokens()
    passages = {k: (t, "x") for k, t in zip("abcdef", ["Alpha", "Beta", "Gamma", "Delta", "Eps", "Zeta"])}
    row_of = {k: i for i, k in enumerate("abcdef")}
    questions = [TrainingQuestion("Where was Alpha born?", ["a", "b"], ["c", "d", "e"]),
                 TrainingQuestion("Who is Zeta?", ["f", "c"], ["a", "b", "d", "e"]),
                 TrainingQuestion("A single gold?", ["e"], ["a"])]  # fewer than two gold: not mined
    # logits by passage: a 0, b 1, c 3, d 0.5, e 2, f 9
    reader = FirstTokenReader({10: 0.0, 11: 1.0, 12: 3.0, 13: 0.5, 14: 2.0, 15: 9.0})
    settings = RerankerSettings(max_length=12, question_tokens=3, context_tokens=3)
    got = mine_second_place(reader, questions, [0, 1, 2], passages, q_tok, p_tok, row_of, settings, 102, 0,
                            pairs_per_pass=3, progress=False)
    assert set(got) == {0, 1}
    # question 0: first hop "a" (named); gold second hop b (1.0) below c (3.0) and e (2.0), above d (0.5)
    assert got[0].context == "a" and got[0].positives == ["b"]
    assert got[0].ranked == ["c", "e", "d"] and got[0].mistakes == 2 and not got[0].first_is_gold
    # question 1: first hop "f"; gold c (3.0) above every negative (a 0, b 1, d 0.5, e 2)
    assert got[1].context == "f" and got[1].ranked == ["e", "b", "d", "a"] and got[1].mistakes == 0
    assert got[1].first_is_gold
    assert second_place_counts(got) == {"questions": 2, "gold_first_after_first_hop": 1, "with_a_mistake": 1,
                                        "mistakes": 2}
    # the context is read: a reader that likes "e" after "f" (and only there) makes a mistake on question 1
    swayed = FirstTokenReader(reader.logit_of_token, {(15, 14): 5.0, (10, 14): -5.0})
    assert mine_second_place(swayed, questions, [1], passages, q_tok, p_tok, row_of, settings, 102, 0,
                             progress=False)[1].mistakes == 1
    assert reader.training  # left as it was found
    reader.eval()
    mine_second_place(reader, questions, [0], passages, q_tok, p_tok, row_of, settings, 102, 0, progress=False)
    assert not reader.training


def test_the_second_place_group_is_the_gold_against_the_hardest_all_after_the_first_hop():
    sp = SecondPlace("a", ["b"], ["c", "e", "d"], 2, False)
    rows, n_pos, ctx = second_place_group(sp, {k: i for i, k in enumerate("abcdef")}, negatives=2)
    assert rows == [1, 2, 4] and n_pos == 1 and ctx == [0, 0, 0]


def _two_gold_rows():
    rows = []
    for i in range(8):
        rows.append({"question": f"Where was the composer of Opera {i} born?",
                     "paragraphs": [{"title": f"Opera {i}", "text": f"Opera {i} was written by Composer {i}.",
                                     "supporting": True},
                                    {"title": f"Composer {i}", "text": f"Composer {i} was born in city {i}.",
                                     "supporting": True}]
                     + [{"title": f"Painter {i}-{j}", "text": f"Painter {i}-{j} lived in town {j}.", "supporting": False}
                        for j in range(4)]})
    return rows


def test_a_second_place_run_trains_on_the_questions_with_a_mistake_and_says_so(tmp_path, tiny_chain_reranker_dir):
    qs, ps = read_training_file(write_jsonl(tmp_path / "t.jsonl", _two_gold_rows()))
    cfg = TrainConfig(epochs=1, questions_per_step=2, negatives=2, max_length=48, question_tokens=16,
                      context_tokens=12, heldout=0.25, lr=1e-3, head_lr=1e-2, second_place="first-hop")
    facts = train(qs, ps, tmp_path / "out", cfg, init=tiny_chain_reranker_dir, progress=False, half=False)
    sp = facts["second_place"]
    assert sp["mined"]["questions"] == 6 and sp["heldout_before"]["questions"] == 2
    assert set(sp["heldout_after"]) == set(sp["heldout_before"])
    assert facts["train_questions"] == sp["mined"]["with_a_mistake"] >= 1  # only those are trained on
    assert facts["steps"] == -(-sp["mined"]["with_a_mistake"] // 2)
    card = (tmp_path / "out/model/MODEL_CARD.md").read_text()
    assert "| second place |" in card and "--second-place first-hop" in card


def test_the_cli_asks_for_a_context_with_second_place(tmp_path, capsys):
    from linearrag_torch.cli import main

    train_file = write_jsonl(tmp_path / "t.jsonl", _two_gold_rows())
    with pytest.raises(SystemExit, match="--second-place reads the first hop as context: give --context-tokens"):
        main(["train-reranker", "--train", str(train_file), "--out", str(tmp_path / "o"), "--second-place", "--quiet"])


def test_engine_mining_orders_the_mined_candidates_by_the_fused_score_after_the_gold_top_one():
    from linearrag_torch.rerank.second_place import mine_engine_second_place

    q_tok, p_tok = _tokens()
    row_of = {k: i for i, k in enumerate("abcdef")}
    # logits by passage: a 0, b 1, c 3, d 0.5, e 2, f 9; the graph's scores fall with its rank
    reader = FirstTokenReader({10: 0.0, 11: 1.0, 12: 3.0, 13: 0.5, 14: 2.0, 15: 9.0})
    questions = [TrainingQuestion("q0", ["a", "b"], ["c", "d", "e"], mined=[("a", 1.0), ("c", 0.5), ("b", 0.4), ("d", 0.2)]),
                 TrainingQuestion("q1", ["a", "b"], ["c"], mined=[("c", 1.0), ("a", 0.9), ("b", 0.5)]),  # top not gold
                 TrainingQuestion("q2", ["a", "f"], ["c"], mined=[("a", 1.0), ("c", 0.9), ("d", 0.5), ("f", 0.1)])]
    settings = RerankerSettings(max_length=12, question_tokens=3, context_tokens=3)
    fusion = RerankerSettings(w_model=1.0, w_rank=-2.0, w_score=0.0)  # fused = logit - 2 log(1 + rank)
    got = mine_engine_second_place(reader, questions, [0, 1, 2], q_tok, p_tok, row_of, settings, fusion, 3, 102, 0,
                                   progress=False)
    assert set(got) == {0}  # q1: the top one is not gold; q2: no other gold among the top 3
    # q0 after "a": c 3 - 2 log 2 = 1.61 above b 1 - 2 log 3 = -1.20 (a mistake); d (rank 3) is beyond the 3 candidates
    assert got[0].context == "a" and got[0].positives == ["b"] and got[0].ranked == ["c"] and got[0].mistakes == 1
    fusion_by_logit = RerankerSettings(w_model=1.0, w_rank=0.0, w_score=0.0)
    q3 = [TrainingQuestion("q3", ["a", "b", "e"], ["c"], mined=[("a", 1.0), ("e", 0.5), ("c", 0.4), ("b", 0.3)])]
    sp = mine_engine_second_place(reader, q3, [0], q_tok, p_tok, row_of, settings, fusion_by_logit, 4, 102, 0,
                                  progress=False)[0]
    assert sp.positives == ["e", "b"] and sp.mistakes == 1 and sp.first_is_gold is False  # c 3 > e 2 > b 1
