"""A lean forward pass for transformers' BertModel (BERT, MiniLM): the encoder's torch path without the
module-call overhead.

transformers' BertModel runs each of its ~110 submodules through nn.Module.__call__ (hooks, output capture,
keyword handling), builds its attention mask through a generic helper, and computes the pooler output,
which mean pooling never reads. For one question alone that overhead was a large share of the encoder
stage on a CPU (measured: docs/benchmarks/throughput.md, "After the lean encoder forward and the graph
trims"). ``BertForward`` issues the same tensor
operations, in the same order and on the same weights, straight from Python: embeddings (word +
token type 0, then + position, LayerNorm), then per layer the query, key and value projections,
``scaled_dot_product_attention`` with the padding mask, the output projection + residual + LayerNorm,
GELU feed-forward + residual + LayerNorm. Its last hidden states equal BertModel's bit for bit, in float32
and under bf16 autocast (tests/indexing/test_bert_forward.py). (One fused query/key/value product would save a few
calls but is not bit-identical: BLAS picks another kernel for a single row.)

Only an eval-mode BertModel that runs attention through SDPA with absolute positions, GELU and plain
nn.Linear layers qualifies (``BertForward.supports``); anything else (an int8 model, eager attention, a
decoder) keeps the module's own forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _onednn_ops():
    """torch's oneDNN operator namespace (torch.ops.mkldnn), or None where this torch has no oneDNN."""
    return torch.ops.mkldnn if torch.backends.mkldnn.is_available() else None


def _packed_bf16_weight(weight: torch.Tensor, bias: torch.Tensor | None):
    """(``weight`` (bfloat16, CPU) packed for oneDNN, the product op that takes it), or None where torch lacks the
    op, packing fails, or the packed product is not F.linear's bit for bit on a few row counts (then F.linear
    serves)."""
    ops = _onednn_ops()
    if weight.device.type != "cpu" or ops is None:
        return None
    try:
        packed, product = ops._reorder_linear_weight(weight, 32), ops._linear_pointwise
        g = torch.Generator().manual_seed(0)
        for rows in ((1,), (26,), (3, 40)):
            x = torch.randn(*rows, weight.shape[1], generator=g).to(weight.dtype)
            if not torch.equal(product(x, packed, bias, "none", [], ""), F.linear(x, weight, bias)):
                return None
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return packed, product


class _Linear:
    """One linear layer as the forward calls it: ``layer(x)`` = F.linear(x, weight, bias) (in ``dtype``, the
    autocast dtype, with the weight cast once, and x cast to it first as autocast would). In bfloat16 on the
    CPU through the weight packed once for oneDNN (_packed_bf16_weight): the same values."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None):
        if dtype is not None:
            weight, bias = weight.detach().to(dtype), None if bias is None else bias.detach().to(dtype)
        self.bias, self.dtype = bias, dtype
        packing = _packed_bf16_weight(weight, bias) if dtype == torch.bfloat16 else None
        self.packed, self._product = packing if packing is not None else (None, None)
        self.weight = weight if self.packed is None else None  # the packed copy replaces it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype is not None:
            x = x.to(self.dtype)  # what autocast does to F.linear's input
        if self.packed is not None:
            return self._product(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class BertForward:
    """``BertForward(model)(input_ids, attention_mask)`` -> the last hidden states [B, T, H] of
    ``model(input_ids=..., attention_mask=..., token_type_ids=zeros).last_hidden_state`` (module doc)."""

    @staticmethod
    def supports(model) -> bool:
        """Whether ``model`` is a BertModel this forward reproduces exactly (module doc)."""
        cfg = getattr(model, "config", None)
        if type(model).__name__ != "BertModel" or cfg is None or model.training:
            return False
        if getattr(cfg, "_attn_implementation", None) != "sdpa" or getattr(cfg, "is_decoder", False):
            return False
        if getattr(cfg, "position_embedding_type", "absolute") != "absolute" or cfg.hidden_act != "gelu":
            return False
        try:
            linears = [m for layer in model.encoder.layer for m in (
                layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
                layer.attention.output.dense, layer.intermediate.dense, layer.output.dense)]
        except AttributeError:
            return False
        return bool(linears) and all(type(m) is torch.nn.Linear for m in linears)  # an int8 layer is not

    def __init__(self, model):
        if not self.supports(model):
            raise ValueError(f"BertForward does not reproduce {type(model).__name__} with this configuration")
        emb = model.embeddings
        self.word = emb.word_embeddings.weight
        self.token_type0 = emb.token_type_embeddings.weight[0]
        self.position = emb.position_embeddings.weight
        self.embed_norm = emb.LayerNorm
        self.heads = model.config.num_attention_heads
        self.layers = []  # per layer: (query, key, value, output, ffn in, ffn out) as (weight, bias), and the rest
        for layer in model.encoder.layer:
            att = layer.attention.self
            linears = (att.query, att.key, att.value, layer.attention.output.dense, layer.intermediate.dense,
                       layer.output.dense)
            self.layers.append((tuple((m.weight, m.bias) for m in linears), att.scaling,
                                layer.attention.output.LayerNorm, layer.output.LayerNorm))
        self._cast: dict = {}  # dtype (None: as they are) -> per layer its linear layers (_Linear)

    def _linears(self, dtype: torch.dtype | None) -> list:
        """Per layer its linear layers as _Linear, in ``dtype`` (weights cast once: autocast casts them on every
        forward pass and gets the same values) or as they are (None); made on first use."""
        if dtype not in self._cast:
            self._cast[dtype] = [tuple(_Linear(w, b, dtype) for w, b in lin) for lin, *_ in self.layers]
        return self._cast[dtype]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 autocast: torch.dtype | None = None) -> torch.Tensor:
        """The last hidden states. ``autocast``: the dtype of the autocast region the call runs in (None: no
        autocast): the linear layers then take their weights cast to it once, not on every call."""
        B, T = input_ids.shape
        x = self.word[input_ids] + self.token_type0
        x = _norm(x + self.position[:T], self.embed_norm)
        # key padding mask, broadcast over heads and query rows (None when nothing is padded, as BertModel)
        mask = None if bool(attention_mask.all()) else attention_mask[:, None, None, :].bool()
        return self._layers(x, mask, autocast, lambda y: y.view(B, T, self.heads, -1).transpose(1, 2),
                            lambda ctx: ctx.transpose(1, 2).reshape(B, T, -1))

    def _layers(self, x: torch.Tensor, mask, autocast, to_heads, from_heads) -> torch.Tensor:
        """The transformer layers on the token states ``x``: ``to_heads`` turns a query, key or value projection
        into [B, heads, T, H / heads] for attention, ``from_heads`` the attention's output back into x's layout."""
        for (q_, k_, v_, out, ffn_in, ffn_out), (_, scale, out_norm, ffn_norm) in zip(self._linears(autocast), self.layers):
            q, k, v = (to_heads(lin(x)) for lin in (q_, k_, v_))
            ctx = from_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale))
            x = _norm(out(ctx) + x, out_norm)
            h = F.gelu(ffn_in(x))
            x = _norm(ffn_out(h) + x, ffn_norm)
        return x

    def packed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               autocast: torch.dtype | None = None) -> torch.Tensor:
        """The last hidden states of a padded batch as ``__call__`` gives them, with the padding left out of
        the per-token work: the embeddings, linear layers, LayerNorms and GELU run on the real tokens only
        (packed one after another), and attention on a padded copy of the query, key and value rows (the
        same ``scaled_dot_product_attention`` call). Padded positions come back as zeros (mean pooling
        ignores them). Worth it where padding is a large share of the batch (a question beside its short
        entity strings); a token's values match ``__call__``'s to float rounding (the products run on
        another number of rows)."""
        B, T = input_ids.shape
        real = attention_mask.reshape(-1).bool()
        slot = torch.nonzero(real).flatten()  # the real tokens' places in the padded [B * T] layout
        position = slot % T
        x = self.word[input_ids.reshape(-1)[slot]] + self.token_type0
        x = _norm(x + self.position[position], self.embed_norm)
        mask = None if slot.numel() == B * T else attention_mask[:, None, None, :].bool()

        def padded(y: torch.Tensor) -> torch.Tensor:  # [tokens, H] -> [B, heads, T, H / heads]
            out = y.new_zeros(B * T, y.shape[1])
            out[slot] = y
            return out.view(B, T, self.heads, -1).transpose(1, 2)

        x = self._layers(x, mask, autocast, padded, lambda ctx: ctx.transpose(1, 2).reshape(B * T, -1)[slot])
        hidden = x.new_zeros(B * T, x.shape[1])
        hidden[slot] = x
        return hidden.view(B, T, -1)


def _norm(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
