"""The CUDA settings run on CPU tensors: reduced-precision encoding."""
import torch

from linearrag_torch.models.encoding import Encoder


def test_autocast_encoding_stays_close_to_float32():
    texts = ["Teutberga was a queen of Lotharingia by marriage to Lothair II.", "Paris", "Who directed Polish-Russian War?"]
    full = Encoder(autocast=None)
    half = Encoder(autocast=torch.bfloat16)  # the code path CUDA takes, with CPU bf16 kernels
    a, b = full.encode(texts), half.encode(texts)
    assert b.dtype == torch.float32 and torch.allclose(b.norm(dim=1), torch.ones(3), atol=1e-5)
    cos = (a * b).sum(dim=1)
    assert bool((cos > 0.99).all()), cos
    assert not torch.equal(a, b)  # the reduced-precision path really ran
