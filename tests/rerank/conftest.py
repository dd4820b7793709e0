"""The tiny cross-encoders the reranker tests share (session fixtures)."""
import pytest
import torch

from linearrag_torch.rerank import RerankerSettings
from linearrag_torch.rerank.model import base_cross_encoder, packaged_base_folder, save_model


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """A 2-layer, 32-wide BERT with the packaged MiniLM's tokenizer, randomly initialised (seed 0)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(packaged_base_folder())).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_reranker_dir(tiny_base, tmp_path_factory):
    """A saved reranker folder with the tiny BERT (random weights, float32) and a fusion that mixes all three
    terms, so that the order it gives differs from the graph's."""
    model, tok = base_cross_encoder(tiny_base, seed=5)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    folder = tmp_path_factory.mktemp("tiny_reranker") / "model"
    save_model(model.eval(), tok, RerankerSettings(max_length=64, question_tokens=24, w_model=3.0, w_rank=-0.3,
                                                   w_score=0.2), folder, half=False)
    return folder
