"""An optional part used without its extra names the extra in one line (a MissingExtra, an ImportError), not a
raw ModuleNotFoundError or a traceback from deep inside. The extra's absence is simulated (sys.modules[name] =
None makes its import fail), so these run whether or not the extras are installed."""
import importlib
import sys

import pytest

from linearrag_torch.extras import MissingExtra

ADAPTERS = [  # (adapter module, the framework package it imports first, the extra that installs it)
    ("linearrag_torch.integrations.langchain", "langchain_core", "langchain"),
    ("linearrag_torch.integrations.llamaindex", "llama_index.core", "llamaindex"),
    ("linearrag_torch.integrations.haystack", "haystack", "haystack"),
]


@pytest.mark.parametrize("module, framework, extra", ADAPTERS)
def test_an_adapter_without_its_framework_names_the_extra(monkeypatch, module, framework, extra):
    monkeypatch.setitem(sys.modules, framework, None)
    monkeypatch.delitem(sys.modules, module, raising=False)  # imported afresh (and dropped again afterwards)
    with pytest.raises(ImportError) as info:
        importlib.import_module(module)
    assert isinstance(info.value, MissingExtra)
    message = str(info.value)
    assert f'pip install -e ".[{extra}]"' in message and framework in message and "\n" not in message, message
    sys.modules.pop(module, None)


def test_the_onnx_backend_without_onnx_runtime_names_the_extra(monkeypatch):
    """The Encoder checks the extra before the export (which needs the onnx package pages deep in torch.onnx)."""
    from linearrag_torch import extras

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingExtra, match=r'onnxruntime.*pip install -e "\.\[onnx\]"'):
        extras.require("onnx", "onnxruntime", "onnx", what="the onnx encoder backend")
    extras.require("onnx", "json", what="nothing")  # present modules pass
