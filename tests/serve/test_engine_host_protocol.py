"""Both engine hosts satisfy the interface the HTTP front drives (serve/host.EngineHost), and a host that lacks a
member does not; sharing loaded models between two indexes is LinearRAG.share_models_from."""
import copy
import dataclasses

import pytest

from linearrag_torch.serve.host import EngineHost
from linearrag_torch.serve.settings import ServeSettings

MEMBERS = {"settings", "metrics", "ready", "load_error", "fingerprint", "default_top_k", "queued", "start", "stop",
           "lifespan", "hits", "reload", "info"}


def test_the_protocol_lists_what_the_front_uses():
    declared = set(EngineHost.__annotations__) | {n for n, v in vars(EngineHost).items()
                                                  if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    assert declared == MEMBERS


def test_the_local_host_is_an_engine_host(small_rag):
    pytest.importorskip("prometheus_client")  # the serve extra: the host's metrics
    from linearrag_torch.serve.engine_host import LocalEngineHost

    host = LocalEngineHost(settings=ServeSettings(), rag=small_rag)
    assert isinstance(host, EngineHost)


def test_the_ray_host_is_an_engine_host():
    pytest.importorskip("prometheus_client")  # the serve extra: the host's metrics
    from linearrag_torch.serve.ray_app import RayEngineHost, RaySettings

    assert isinstance(RayEngineHost(ServeSettings(), engine=None, ray_settings=RaySettings()), EngineHost)


def test_a_host_without_hits_is_not_one():
    class Partial:
        settings = metrics = load_error = fingerprint = None
        ready, default_top_k, queued = False, 5, 0

        async def start(self): ...
        async def stop(self): ...
        def lifespan(self, app=None): ...
        async def reload(self): ...
        async def info(self): ...

    assert not isinstance(Partial(), EngineHost)
    Partial.hits = lambda self, key, items: []
    assert isinstance(Partial(), EngineHost)


def test_share_models_from_reuses_what_is_loaded_and_matches(small_rag):
    from linearrag_torch import LinearRAG

    small_rag.encoder, small_rag.nlp  # noqa: B018 (loaded)
    twin = LinearRAG(small_rag.index, small_rag.device).share_models_from(small_rag)
    assert twin.encoder is small_rag.encoder and twin.nlp is small_rag.nlp
    other = LinearRAG(small_rag.index, small_rag.device, quantize="int8")  # another question encoder
    other.share_models_from(small_rag)
    assert other.nlp is small_rag.nlp and other.models.loaded_encoder is None
    index = copy.copy(small_rag.index)  # another spaCy model: nothing of spaCy is shared
    index.index_config = dataclasses.replace(index.index_config, spacy_model="another_model")
    third = LinearRAG(index, small_rag.device).share_models_from(small_rag)
    assert third.models.loaded_nlp is None and third.ner_pool is None and third.encoder is small_rag.encoder
