"""The learned reranker: a cross-encoder that rescores the graph's top candidates (``RetrievalConfig.rerank``).

model.py (the network, its folder on disk), scoring.py (pairs built and scored on the engine's device, the
fused score), train.py (`linearrag train-reranker`; options.py holds its settings and flags). The trained
model ships in ``rerank/model/`` (its MODEL_CARD.md says how it was made). Names load on first use, so
that the command line's parser does not import torch.
"""
__all__ = ["Reranker", "Reranked", "RerankerLoadError", "RerankerSettings", "packaged_reranker_folder"]


def __getattr__(name):
    if name in ("Reranker", "Reranked"):
        from . import scoring

        return getattr(scoring, name)
    if name in ("RerankerLoadError", "RerankerSettings", "packaged_reranker_folder"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
