"""`--encoder FOLDER` takes any local sentence-transformers folder (mean pooling, normalised), e.g. the paper's
all-mpnet-base-v2: checked on a tiny stand-in folder (conftest's 2-layer BERT with random weights and MiniLM's
tokenizer, laid out as sentence-transformers saves a model), its vectors against transformers' BertModel by hand."""
import json

import pytest
import torch

from conftest import demo_corpus, write_jsonl
from linearrag_torch import LinearRAG
from linearrag_torch.cli import main


@pytest.fixture(scope="module")
def tiny_st_folder(tiny_base, tmp_path_factory):
    """A copy of the tiny BERT (conftest.tiny_base) laid out as sentence-transformers saves a model."""
    import shutil

    folder = tmp_path_factory.mktemp("tiny_st") / "model"
    shutil.copytree(tiny_base, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                  "pooling_mode_mean_tokens": True}))
    return folder


def by_hand(folder, texts):
    """Mean-pooled, L2-normalised last hidden states of transformers' own BertModel."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1)


def test_index_and_query_with_a_local_sentence_transformers_folder(tiny_st_folder, tmp_path, capsys):
    passages = demo_corpus()[:8]
    corpus = write_jsonl(tmp_path / "c.jsonl", passages)
    out = tmp_path / "index"
    assert main(["index", str(corpus), str(out), "--encoder", str(tiny_st_folder), "--max-length", "128", "--quiet",
                 "--device", "cpu", "--encoder-precision", "float32"]) == 0
    rag = LinearRAG.load(out, device="cpu")
    assert rag.index.dim == 32 and rag.index.index_config.encoder == str(tiny_st_folder)
    texts = [rag.index.passage_text(i) for i in range(rag.index.num_passages)]
    want = by_hand(tiny_st_folder, texts)
    assert torch.allclose(rag.index.passage_emb.float(), want, atol=2e-5)
    capsys.readouterr()
    assert main(["query", str(out), passages[0]["title"], "--json", "--device", "cpu"]) == 0
    hits = json.loads(capsys.readouterr().out.splitlines()[0])["hits"]
    assert len(hits) == 5 and {h["id"] for h in hits} <= {p["id"] for p in passages}
