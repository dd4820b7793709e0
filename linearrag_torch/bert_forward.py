"""A lean forward pass for transformers' BertModel (BERT, MiniLM): the encoder's torch path without the
module-call overhead.

transformers' BertModel runs each of its ~110 submodules through nn.Module.__call__ (hooks, output capture,
keyword handling), builds its attention mask through a generic helper, and computes the pooler output,
which mean pooling never reads. For one question alone that overhead was about a quarter of the encoder
stage on a 2-core CPU (hotpotqa_train100 questions: 17.2 against 13.1 ms, best of 4 alternating runs). ``BertForward`` issues the same tensor
operations, in the same order and on the same weights, straight from Python: embeddings (word +
token type 0, then + position, LayerNorm), then per layer the query, key and value projections,
``scaled_dot_product_attention`` with the padding mask, the output projection + residual + LayerNorm,
GELU feed-forward + residual + LayerNorm. Its last hidden states equal BertModel's bit for bit, in float32
and under bf16 autocast (tests/test_bert_forward.py). (One fused query/key/value product would save a few
calls but is not bit-identical: BLAS picks another kernel for a single row.)

Only an eval-mode BertModel that runs attention through SDPA with absolute positions, GELU and plain
nn.Linear layers qualifies (``BertForward.supports``); anything else (an int8 model, eager attention, a
decoder) keeps the module's own forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
        self.layers = []
        for layer in model.encoder.layer:
            att = layer.attention.self
            self.layers.append((
                att.query, att.key, att.value, att.scaling,
                layer.attention.output.dense, layer.attention.output.LayerNorm,
                layer.intermediate.dense, layer.output.dense, layer.output.LayerNorm,
            ))

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        x = self.word[input_ids] + self.token_type0
        x = _norm(x + self.position[:T], self.embed_norm)
        # key padding mask, broadcast over heads and query rows (None when nothing is padded, as BertModel)
        mask = None if bool(attention_mask.all()) else attention_mask[:, None, None, :].bool()
        for query, key, value, scale, out, out_norm, ffn_in, ffn_out, ffn_norm in self.layers:
            q, k, v = (F.linear(x, p.weight, p.bias).view(B, T, self.heads, -1).transpose(1, 2) for p in (query, key, value))
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            ctx = ctx.transpose(1, 2).reshape(B, T, -1)
            x = _norm(F.linear(ctx, out.weight, out.bias) + x, out_norm)
            h = F.gelu(F.linear(x, ffn_in.weight, ffn_in.bias))
            x = _norm(F.linear(h, ffn_out.weight, ffn_out.bias) + x, ffn_norm)
        return x


def _norm(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
