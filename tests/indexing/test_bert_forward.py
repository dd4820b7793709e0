"""bert_forward.BertForward: the encoder's lean forward equals transformers' BertModel bit for bit (float32
and bf16 autocast, padded batches), and models it does not reproduce keep their own forward."""
import pytest
import torch

from linearrag_torch.models.bert_forward import BertForward
from linearrag_torch.models.encoding import Encoder
from linearrag_torch.env import native_bf16


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
        assert lean._cast[autocast][0][0].dtype == autocast and len(lean._cast) == 1


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_encoder_uses_it_and_its_vectors_are_the_models(encoder, precision):
    encoder = encoder.with_precision(precision)
    assert encoder._lean is not None  # the packaged MiniLM qualifies
    texts = ["Who directed Polish-Russian War?", "Who directed the film Polish-Russian War?", "Teutberga was a queen."]
    plain = Encoder(precision=precision)
    plain._lean = None  # BertModel's own forward
    # texts of about one length: one pass with little padding, not packed: bit for bit, except bf16 on a CPU that
    # computes it natively (AMX / AVX512-BF16: oneDNN's bf16 kernels there differ from BertModel's by ~3e-4)
    got, want = encoder.encode(texts), plain.encode(texts)
    if precision == "bfloat16" and native_bf16("cpu"):
        assert torch.allclose(got, want, atol=2e-3, rtol=0), float((got - want).abs().max())
    else:
        assert torch.equal(got, want)
    # much padding: the pass runs packed (BertForward.packed), equal to float rounding
    texts += ["Paris", "Teutberga was a queen of Lotharingia by marriage to Lothair II, King of Lotharingia."]
    got, want = encoder.encode(texts), plain.encode(texts)
    assert torch.allclose(got, want, atol=1e-6 if precision == "float32" else 1e-2, rtol=0), float((got - want).abs().max())


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_packed_forward_equals_the_padded_one(encoder, autocast):
    """BertForward.packed skips the padding's per-token work: the real tokens' states match __call__'s (to
    float rounding: its products run on another number of rows), padded positions are zeros."""
    lean = BertForward(encoder.model)
    tol = 1e-5 if autocast is None else 5e-2
    for ids, mask in _batches():
        with torch.inference_mode(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            want, got = lean(ids, mask, autocast), lean.packed(ids, mask, autocast)
        assert got.dtype == want.dtype and got.shape == want.shape
        real = mask.bool()
        assert torch.allclose(got[real], want[real], atol=tol, rtol=0), float((got[real] - want[real]).abs().max())
        assert not got[~real].any()


def test_question_passes_with_much_padding_are_packed(encoder, monkeypatch):
    """encode_token_ids packs a pass whose padded tokens reach PACK_MIN_PADDED times its real ones (a question
    beside short entity strings), not one without padding; the vectors are those of the padded pass."""
    from linearrag_torch.models import encoding

    calls = []
    real_packed = BertForward.packed
    monkeypatch.setattr(BertForward, "packed", lambda self, *a: calls.append(a[0].shape) or real_packed(self, *a))
    ids = encoder.token_keys(["Who was the spouse of the director of Polish-Russian War?", "Paris", "Lothair II"])
    mixed = encoder.encode_token_ids(ids)
    assert calls == [(3, len(ids[0]))]
    encoder.encode_token_ids(ids[:1])
    assert len(calls) == 1  # one question alone: no padding, not packed
    monkeypatch.setattr(encoding, "PACK_MIN_PADDED", float("inf"))
    assert torch.allclose(mixed, encoder.encode_token_ids(ids), atol=1e-6, rtol=0)
    assert len(calls) == 1


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


def test_bf16_linear_layers_packed_for_onednn_give_f_linear_values(encoder, monkeypatch):
    """Under bf16 autocast each linear layer's weight is cast and packed once (where oneDNN's packed product
    passes its bit-for-bit check); the layer gives F.linear's values either way, and a packing whose check
    fails is not used."""
    import torch.nn.functional as F

    from linearrag_torch.models import bert_forward

    dense = encoder.model.encoder.layer[0].intermediate.dense
    w, b = dense.weight.detach().bfloat16(), dense.bias.detach().bfloat16()
    x = torch.randn(2, 7, dense.in_features, generator=torch.Generator().manual_seed(1))  # float32, cast as autocast
    with torch.inference_mode():
        layer = bert_forward._Linear(dense.weight, dense.bias, torch.bfloat16)
        assert layer.dtype == torch.bfloat16 and (layer.packed is None) == (layer.weight is not None)
        assert torch.equal(layer(x), F.linear(x.bfloat16(), w, b))
        if bert_forward._onednn_ops() is None:
            pytest.skip("this torch has no oneDNN: F.linear serves")

        class WrongProducts:  # oneDNN ops whose packed product differs from F.linear
            _reorder_linear_weight = staticmethod(lambda weight, rows: weight.clone())

            @staticmethod
            def _linear_pointwise(x, packed, bias, *args):
                return F.linear(x, packed, bias) * 1.5

        monkeypatch.setattr(bert_forward, "_onednn_ops", lambda: WrongProducts)
        refused = bert_forward._Linear(dense.weight, dense.bias, torch.bfloat16)
        assert refused.packed is None and torch.equal(refused(x), F.linear(x.bfloat16(), w, b))
        assert bert_forward._Linear(dense.weight, dense.bias, None).packed is None  # float32: never packed
