"""One pass per passage (IndexConfig.sentence_vectors="passage", Encoder.encode_with_spans) and the int8 encoder
precision: windows that cover a long passage, sentence vectors equal to an independent mean-pool of the passage's
token states, passage vectors equal to encode()'s, int8 vectors close to float32's, and a build that stores them."""
import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import small_passages
from linearrag_torch.config import IndexConfig
from linearrag_torch.corpus import as_passages
from linearrag_torch.indexing.build import build_index, sentence_spans
from linearrag_torch.index import passage_text
from linearrag_torch.models import encoding
from linearrag_torch.models.encoding import Encoder, resolve_precision, token_windows

TEXT = ("Teutberga was a queen of Lotharingia by marriage to Lothair II. She was a daughter of Bosonid Boso the "
        "Elder and sister of Hucbert, the lay-abbot of St. Maurice's Abbey.")


@pytest.mark.parametrize("n,width,overlap", [(1, 4, 0.25), (4, 4, 0.25), (5, 4, 0.25), (10, 4, 0.5), (100, 14, 0.25),
                                             (254, 254, 0.25), (700, 254, 0.25), (9, 2, 0.5)])
def test_windows_cover_every_token_and_overlap(n, width, overlap):
    wins = token_windows(n, width, overlap)
    assert wins[0][0] == 0 and wins[-1][1] == n
    assert all(0 < b - a <= width for a, b in wins)
    covered = set()
    for a, b in wins:
        covered.update(range(a, b))
    assert covered == set(range(n))
    for (a0, b0), (a1, b1) in zip(wins, wins[1:]):  # consecutive windows share tokens, none is skipped
        assert a0 < a1 < b0 < b1
    if n <= width:
        assert wins == [(0, n)]


def test_window_examples_by_hand():
    assert token_windows(10, 4, 0.5) == [(0, 4), (2, 6), (4, 8), (6, 10)]
    assert token_windows(7, 4, 0.25) == [(0, 4), (3, 7)]  # one shared token; the last window ends at n


def _states(enc: Encoder, ids: list) -> torch.Tensor:
    """The model's last hidden states of one row [CLS] + ids + [SEP] (transformers' own forward)."""
    row = torch.tensor([[enc.tokenizer.cls_token_id, *ids, enc.tokenizer.sep_token_id]])
    with torch.inference_mode():
        return enc.model(input_ids=row, attention_mask=torch.ones_like(row),
                         token_type_ids=torch.zeros_like(row)).last_hidden_state[0]


def _independent_span(enc: Encoder, text: str, first: int, end: int, window=None) -> torch.Tensor:
    tok = enc.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = tok["input_ids"], tok["offset_mapping"]
    a, b = window or (0, len(ids))
    h = _states(enc, ids[a:b])
    rows = [1 + i - a for i, (s, e) in enumerate(offsets) if e > first and s < end and a <= i < b]
    return F.normalize(h[rows].mean(0), dim=0)


def test_span_vectors_are_the_mean_of_the_passage_token_states(encoder):
    texts = [TEXT, "Paris\nParis is the capital of France."]
    second = TEXT.index("She")
    spans = [(0, 0, second - 1), (0, second, len(TEXT)), (1, 0, 5), (1, 6, len(texts[1]))]
    pv, sv = encoder.encode_with_spans(texts, spans)
    for s, (t, a, b) in enumerate(spans):
        want = _independent_span(encoder, texts[t], a, b)
        assert float(sv[s] @ want) > 0.99999, (s, texts[t][a:b])
    # a passage that fits the window: the vector encode() gives it
    assert float((pv * encoder.encode(texts)).sum(1).min()) > 0.99999
    # a sentence read in its passage is not the sentence read alone (its context enters)
    alone = encoder.encode([TEXT[second:]])[0]
    assert float(sv[1] @ alone) < 0.9999


def _farthest_from_an_edge(enc: Encoder, ids: list, wins: list) -> torch.Tensor:
    """Each token's state from the window where it lies farthest from an edge (a tie: the later window)."""
    states = [_states(enc, ids[a:b]) for a, b in wins]
    out = []
    for i in range(len(ids)):
        k = max((k for k, (a, b) in enumerate(wins) if a <= i < b), key=lambda k: (min(i - wins[k][0],
                                                                                       wins[k][1] - 1 - i), k))
        out.append(states[k][1 + i - wins[k][0]])
    return torch.stack(out), states


def test_a_long_passage_is_read_in_overlapping_windows_not_truncated(encoder):
    short = copy.copy(encoder)  # a copy whose window is 16 tokens
    short.max_length = 16
    text = " ".join([TEXT] * 3)
    tok = short.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = tok["input_ids"], tok["offset_mapping"]
    wins = token_windows(len(ids), 14)
    assert len(wins) > 3
    per_token, states = _farthest_from_an_edge(short, ids, wins)
    middle = text.index("She", len(TEXT))
    spans = [(0, middle, middle + 60), (0, text.rindex("the lay-abbot"), len(text)), (0, 0, len(text))]
    pv, sv = short.encode_with_spans([text], spans)
    for s, (_, a, b) in enumerate(spans):
        rows = [i for i, (x, y) in enumerate(offsets) if y > a and x < b]
        want = F.normalize(per_token[rows].mean(0), dim=0)
        assert float(sv[s] @ want) > 0.99999, s
    # the passage: every token once, with the first window's [CLS] and the last one's [SEP]
    want = F.normalize(torch.cat([states[0][:1], per_token, states[-1][-1:]]).mean(0), dim=0)
    assert float(pv[0] @ want) > 0.99999
    assert float(pv[0] @ short.encode([text])[0]) < 0.999  # not the truncated encode() vector


def test_sentence_spans_find_each_sentence_in_its_passage(nlp):
    from linearrag_torch.models.nlp import analyse_passages

    texts = [TEXT, "Lothair II\nLothair II was king. She was a daughter of Bosonid Boso the Elder and sister of "
                   "Hucbert, the lay-abbot of St. Maurice's Abbey."]
    analyses = analyse_passages(nlp, texts, ("CARDINAL",), n_process=1, progress=False)
    wanted = [s for a in analyses for s in a.sentences]
    got = sentence_spans(texts, analyses, list(dict.fromkeys(wanted)))
    for s, (t, a, b) in zip(dict.fromkeys(wanted), got):
        assert texts[t][a:b] == s
    shared = "She was a daughter of Bosonid Boso the Elder and sister of Hucbert, the lay-abbot of St. Maurice's Abbey."
    assert got[list(dict.fromkeys(wanted)).index(shared)][0] == 0  # its first passage
    with pytest.raises(ValueError, match="is in no passage"):
        sentence_spans(texts, analyses, ["Not a sentence of these."])


def test_one_pass_build_stores_the_passage_pass_vectors(nlp, encoder):
    passages = as_passages(small_passages()[:5])
    cfg = IndexConfig(encoder_precision="float32", sentence_vectors="passage")
    one = build_index(passages, cfg, progress=False, nlp=nlp, encoder=encoder)
    two = build_index(passages, IndexConfig(encoder_precision="float32"), progress=False, nlp=nlp, encoder=encoder)
    assert one.sentences == two.sentences and one.entities == two.entities
    assert torch.equal(one.M.to_dense(), two.M.to_dense()) if hasattr(one.M, "to_dense") else True
    assert one.index_config.sentence_vectors == "passage"
    assert torch.allclose(one.entity_emb, two.entity_emb, atol=1e-5)
    assert float((one.passage_emb * two.passage_emb).sum(1).min()) > 0.99999
    texts = [passage_text(p.title, p.text) for p in passages]
    for s, sent in enumerate(one.sentences):
        t = next(i for i, x in enumerate(texts) if sent in x)
        a = texts[t].index(sent)
        want = _independent_span(encoder, texts[t], a, a + len(sent))
        assert float(one.sentence_emb[s] @ want) > 0.9999, sent
    assert torch.equal(one.keys.sentences, two.keys.sentences) and torch.equal(one.keys.passages, two.keys.passages)


def test_sentence_vectors_setting_is_checked_and_old_indexes_read_separate():
    with pytest.raises(ValueError, match="sentence_vectors must be one of"):
        IndexConfig(sentence_vectors="window")
    old = IndexConfig().to_dict()
    del old["sentence_vectors"]
    assert IndexConfig.from_dict(old).sentence_vectors == "separate"


def test_int8_precision_vectors_close_to_float32(encoder):
    texts = [TEXT, "Paris", "Who directed Polish-Russian War?", "The film was released in 1998 by Warner Bros."]
    int8 = Encoder(precision="int8")
    assert int8.precision == "int8" and int8.quantize == "int8" and int8.autocast is None
    cos = (int8.encode(texts) * encoder.encode(texts)).sum(1)
    assert bool((cos > 0.95).all()) and bool((cos < 0.99999).any()), cos  # close, and really quantised
    twin = encoder.with_precision("int8")
    assert twin.precision == "int8" and encoder.precision == "float32"  # the float32 one is left as it was
    assert float((twin.encode(texts) * int8.encode(texts)).sum(1).min()) > 0.9999
    assert resolve_precision("int8", "cpu") == "int8"
    with pytest.warns(RuntimeWarning, match="CPU only"):
        assert resolve_precision("int8", "meta") == "float32"


def test_auto_without_native_bf16_is_the_measured_choice(monkeypatch):
    from linearrag_torch import env
    from linearrag_torch.rerank import scoring

    monkeypatch.setattr(env, "native_bf16", lambda device: False)
    assert resolve_precision("auto", "cpu") == encoding.AUTO_WITHOUT_BF16
    assert scoring.resolve_precision("auto", "cpu") == scoring.AUTO_WITHOUT_BF16
    monkeypatch.setattr(env, "native_bf16", lambda device: True)
    assert resolve_precision("auto", "cpu") == "bfloat16" == scoring.resolve_precision("auto", "cpu")


def test_one_pass_needs_an_encoder_that_can_do_it(nlp):
    class StandIn:  # encoding.TextEncoder's three members, no encode_with_spans
        dim = 4

        def token_keys(self, texts):
            return list(texts)

        def encode(self, texts, progress=False, desc="", keys=None):
            return torch.ones(len(texts), 4) / 2

    passages = as_passages(small_passages()[:2])
    with pytest.raises(ValueError, match="needs an encoder with encode_with_spans"):
        build_index(passages, IndexConfig(sentence_vectors="passage"), progress=False, nlp=nlp, encoder=StandIn())
