"""bert_forward.BertForward: the encoder's lean forward equals transformers' BertModel bit for bit (float32
and bf16 autocast, padded batches), and models it does not reproduce keep their own forward."""
import pytest
import torch

from linearrag_torch.bert_forward import BertForward
from linearrag_torch.encoding import Encoder


def _model_hidden(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state


def _batches():
    g = torch.Generator().manual_seed(0)
    out = []
    for rows, length in ((1, 1), (1, 23), (3, 9), (16, 40)):
        ids = torch.randint(1000, 29000, (rows, length), generator=g)
        mask = torch.ones(rows, length, dtype=torch.int64)
        for r in range(1, rows):  # rows 1.. padded to a shorter length (row 0 is the longest)
            mask[r, 1 + r % length:] = 0
        out.append((ids * mask, mask))
    return out


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_equals_bert_model_bit_for_bit(encoder, autocast):
    model, lean = encoder.model, BertForward(encoder.model)
    for ids, mask in _batches():
        with torch.inference_mode(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            want, got = _model_hidden(model, ids, mask), lean(ids, mask, autocast)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want), (ids.shape, float((got - want).abs().max()))
    if autocast is not None:  # the weights were cast once, and kept
        assert lean._cast[autocast][0][0][0].dtype == autocast and len(lean._cast) == 1


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_encoder_uses_it_and_its_vectors_are_the_models(encoder, precision):
    encoder = encoder.with_precision(precision)
    assert encoder._lean is not None  # the packaged MiniLM qualifies
    texts = ["Who directed Polish-Russian War?", "Paris", "Teutberga was a queen of Lotharingia by marriage to Lothair II."]
    with_lean = encoder.encode(texts)
    plain = Encoder(precision=precision)
    plain._lean = None  # BertModel's own forward
    assert torch.equal(with_lean, plain.encode(texts))
    ids = encoder.token_keys(texts)
    assert torch.equal(encoder.encode_token_ids(ids), plain.encode_token_ids(ids))


def test_models_it_does_not_reproduce_keep_their_forward(encoder):
    assert not BertForward.supports(Encoder(quantize="int8").model)  # int8 Linear layers
    assert Encoder(quantize="int8")._lean is None
    model = encoder.model
    model.train()
    try:
        assert not BertForward.supports(model)  # dropout active
    finally:
        model.eval()
    eager = Encoder(precision="float32").model
    eager.config._attn_implementation = "eager"
    assert not BertForward.supports(eager)
    assert not BertForward.supports(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="does not reproduce"):
        BertForward(eager)
