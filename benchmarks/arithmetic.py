"""How far a stage is from the machine's limit (issue 50): the encoder's FLOP/s against a matmul peak measured
here with the encoder's own shapes and arithmetic, and NER words per second.

The encoder's work is counted from the token counts of what it encoded: per layer and token, the four
attention projections (4 d^2 multiply-adds) and the feed-forward pair (2 d f), plus the attention itself
(2 n d per token of an n-token row); 2 FLOPs per multiply-add. The peak is the best of a few timed chains of
the same products (rows of ``PEAK_ROWS`` tokens through d x d, d x f and f x d), in float32, under bf16
autocast, or through torch's dynamically quantised int8 Linear layers: what the transformer's products reach
at best on these cores, so that the fraction says how much of a stage is overhead (tokenizer, attention,
layer norms, host work) rather than products.
"""
from __future__ import annotations

import time

import torch

PEAK_ROWS = 4096  # tokens in a product: the build's passes hold about this many (encoding.ENCODE_TOKEN_BUDGET)


def encoder_flops(lengths, layers: int, hidden: int, intermediate: int) -> float:
    """FLOPs of a BERT encoder over rows of the given token counts (special tokens included)."""
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * intermediate)
    return float(layers * sum(n * per_token + 2 * 2 * n * n * hidden for n in lengths))


def model_shape(encoder) -> tuple[int, int, int]:
    """(layers, hidden, intermediate) of an encoding.Encoder's transformer."""
    c = encoder.model.config
    return int(c.num_hidden_layers), int(c.hidden_size), int(c.intermediate_size)


def matmul_peak(precision: str, hidden: int, intermediate: int, rows: int = PEAK_ROWS, repeats: int = 5) -> float:
    """Best FLOP/s of the transformer's product chain (d->d, d->f, f->d) over ``rows`` tokens in ``precision``
    ("float32", "bfloat16" (autocast) or "int8" (torch dynamic quantisation, per-channel weights))."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, intermediate),
                                 torch.nn.Linear(intermediate, hidden)).eval()
    if precision.startswith("int8"):
        from linearrag_torch.models.encoding import quantize_int8

        layers = quantize_int8(layers, all_layers=True)
    x = torch.randn(rows, hidden)
    flops = 2.0 * rows * (hidden * hidden + 2 * hidden * intermediate)
    auto = precision == "bfloat16"
    best = float("inf")
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=auto):
        layers(x)
        for _ in range(repeats):
            t = time.perf_counter()
            layers(x)
            best = min(best, time.perf_counter() - t)
    return flops / best


def token_lengths(tokenizer, texts, max_length: int) -> list:
    """Token counts of ``texts`` as encode() feeds them (special tokens, truncated to ``max_length``)."""
    if not texts:
        return []
    return [len(x) for x in tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]]


def window_lengths(tokenizer, texts, max_length: int) -> list:
    """Token counts of the windows encode_with_spans reads ``texts`` in (special tokens included)."""
    from linearrag_torch.models.encoding import token_windows

    ids = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return [b - a + 2 for x in ids for a, b in token_windows(len(x), max_length - 2)]


def words(texts) -> int:
    """Whitespace-separated words of ``texts`` (NER's rate is words per second)."""
    return sum(len(t.split()) for t in texts)
