"""The learned reranker: a cross-encoder that rescores the graph's top candidates (``RetrievalConfig.rerank``).

scoring.py (pairs built and scored on the engine's device, the fused score), train.py (`linearrag
train-reranker`; cli/train_reranker.py holds its flags). The network and its folder on disk are models/reranker.py; the
trained model ships in ``linearrag_torch/data/reranker/`` (its MODEL_CARD.md says how it was made). Names load on first use, so
that the command line's parser does not import torch.
"""
__all__ = ["Reranker", "Reranked", "RerankerLoadError", "RerankerSettings", "packaged_reranker_folder"]


def __getattr__(name):  # deferred: the lazy names (see above)
    if name in ("Reranker", "Reranked"):
        from . import scoring

        return getattr(scoring, name)
    if name in ("RerankerLoadError", "RerankerSettings", "packaged_reranker_folder"):
        from ..models import reranker

        return getattr(reranker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
