"""The flags several commands share, made from the settings they set: one flag per field of a settings dataclass
(RetrievalConfig, IndexConfig, ServeSettings, RaySettings: each field's ``_f`` help and default, config.py), the
retrieval settings of index / query / answer, --device, the chat model's flags (answer, serve, benchmarks.qa) and
the Ray build's (index, add); and the settings objects made back from the parsed flags."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import fields

from ..answers.chat import DEFAULT_CACHE, ENV_API_KEY, ENV_BASE_URL, ENV_CACHE, ENV_MODEL, LLM
from ..config import RetrievalConfig
from .common import retrieval_settings


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_flags(group, cls, unset_none: bool = False, show_defaults: bool = True, skip: tuple = ()) -> tuple:
    """One flag per field of the settings dataclass ``cls`` (RetrievalConfig, IndexConfig, ServeSettings,
    RaySettings) on an argparse group, dest = the field name: booleans as --name / --no-name, the rest typed from
    the field; --help shows each field's help (and its default with ``show_defaults``). A flag left out gives the
    field's default, or None with ``unset_none`` (the caller keeps what it has, e.g. the settings stored with an
    index: RetrievalConfig.replace ignores None). Returns the names of the fields given a flag."""
    names = []
    for f in fields(cls):
        if f.name in skip:
            continue
        meta = f.metadata
        shown = ",".join(f.default) if isinstance(f.default, tuple) else f.default
        text = f"{meta['help']} (default {shown})" if show_defaults and "(default" not in meta["help"] else meta["help"]
        kw = {"default": None if unset_none else f.default, "help": text}
        if isinstance(f.default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = meta.get("type") or type(f.default)
            if "flag" in meta:
                kw["metavar"] = meta["flag"].lstrip("-").replace("-", "_").upper()
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        group.add_argument(flag_name(f), dest=f.name, **kw)
        names.append(f.name)
    return tuple(names)


def settings_from_args(cls, args):
    """The settings dataclass ``cls`` (ServeSettings, RaySettings) from the flags add_flags made for it."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def device_arg(p) -> None:
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default auto)")


# ------------------------------------------------------------------------------------ retrieval settings
def add_retrieval_flags(p: argparse.ArgumentParser, stored: bool) -> None:
    """The RetrievalConfig flags (config.py holds each one's help). Left out, a flag keeps the stored
    value (query, answer) or the library's default (index): the flags default to None either way."""
    if stored:
        g = p.add_argument_group("retrieval settings", "default: the values stored with the index")
    else:  # `index`: nothing here changes the build; the values become the index's stored defaults
        g = p.add_argument_group(
            "retrieval settings stored with the index",
            "not used to build it: stored as the defaults of query, answer and serve, which take the same flags "
            "per call; default: the library's (docs/QUALITY.md; see --reference-code)",
        )
    # query and answer have their own --top-k (per call, not stored)
    names = add_flags(g, RetrievalConfig, unset_none=True, show_defaults=not stored, skip=("top_k",) if stored else ())
    p.set_defaults(retrieval_fields=names)
    g.add_argument("--reference-code", action="store_true",
                   help="start from the reference code's settings (lam 0.05, damping 0.5, no lexicon seeds, one round)")


def retrieval_config(args, base: RetrievalConfig) -> RetrievalConfig:
    """``base`` (or the reference code's settings with --reference-code) changed by the flags given."""
    if args.reference_code:
        base = RetrievalConfig.reference_code(top_k=base.top_k)
    return base.replace(**retrieval_settings(args))


# ------------------------------------------------------------------------------------ the chat model
def add_llm_flags(p, judge: bool = False) -> None:
    """The chat-model flags shared by `linearrag answer`, `linearrag serve` and `python -m benchmarks.qa`."""
    g = p.add_argument_group("chat model", "any OpenAI-compatible chat-completions endpoint (needs pip install "
                                           "'linearrag_torch[gen]'); the API key is never printed")
    g.add_argument("--llm-base-url", metavar="URL", default=None,
                   help=f"endpoint base URL, e.g. http://localhost:8000/v1 (default ${ENV_BASE_URL}, else $OPENAI_BASE_URL)")
    g.add_argument("--llm-model", metavar="NAME", default=None, help=f"model name (default ${ENV_MODEL})")
    g.add_argument("--llm-api-key", metavar="KEY", default=None,
                   help=f"API key (default ${ENV_API_KEY}, else $OPENAI_API_KEY, else none; prefer the environment: "
                        "a flag shows in the process list)")
    g.add_argument("--llm-timeout", type=float, default=60.0, metavar="S", help="seconds per request (default %(default)s)")
    g.add_argument("--llm-max-retries", type=int, default=4, metavar="N",
                   help="retries after a 429, 5xx, timeout or connection failure, with exponential backoff "
                        "(default %(default)s)")
    g.add_argument("--llm-concurrency", type=int, default=8, metavar="N", help="requests in flight at once (default %(default)s)")
    g.add_argument("--llm-max-tokens", type=int, default=512, metavar="N", help="reply length cap (default %(default)s)")
    g.add_argument("--llm-temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default %(default)s)")
    g.add_argument("--llm-cache", metavar="FILE", default=None,
                   help=f"SQLite reply cache (default ${ENV_CACHE}, else {DEFAULT_CACHE}); a rerun of the same "
                        "model, messages and settings costs no tokens")
    g.add_argument("--no-llm-cache", action="store_true", help="neither read nor write the reply cache")
    if judge:
        g.add_argument("--judge-model", metavar="NAME", default=None, help="LLM-judge model (default: --llm-model)")
        g.add_argument("--judge-base-url", metavar="URL", default=None, help="LLM-judge endpoint (default: --llm-base-url)")
        g.add_argument("--no-judge", action="store_true", help="skip the LLM-judge accuracy")


def llm_from_args(args, notify=None):
    """An answers.generation.LLM from the add_llm_flags flags (raises LLMError when the URL or the model is
    missing); ``notify``: LLM's (the command line prints its retry notices)."""
    cache = {"cache": None} if args.no_llm_cache else {"cache": args.llm_cache} if args.llm_cache else {}  # {}: LLM's default
    return LLM(args.llm_base_url, args.llm_model, args.llm_api_key, timeout=args.llm_timeout,
               max_retries=args.llm_max_retries, concurrency=args.llm_concurrency, temperature=args.llm_temperature,
               max_tokens=args.llm_max_tokens, notify=notify, **cache)


# ------------------------------------------------------------------------------------ the Ray build
def add_ray_build_flags(p) -> None:
    """--ray [ADDRESS] and the actor flags of `linearrag index` and `linearrag add` (indexing/ray_build.py)."""
    g = p.add_argument_group("Ray cluster", 'run NER and encoding on a Ray cluster with Ray Data (pip install -e ".[ray]"); '
                                            "the index equals the local build's")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="build on Ray: ADDRESS of the head node (HOST:6379, or ray://HOST:10001 for Ray Client), "
                        "'local' for a new Ray on this machine; without ADDRESS: $RAY_ADDRESS, or the Ray started "
                        "here with `ray start`, else a new local one")
    g.add_argument("--ray-ner-actors", type=int, default=None, metavar="N",
                   help="spaCy actors, 1 CPU each (default: one per CPU of the cluster)")
    g.add_argument("--ray-encode-actors", type=int, default=None, metavar="N",
                   help="encoder actors (default: one per GPU, else one per --ray-encode-cpus CPUs)")
    g.add_argument("--ray-encode-cpus", type=float, default=None, metavar="C",
                   help="CPUs (and torch threads) of each encoder actor (default: 1 for GPU actors; for CPU actors "
                        "the cores of this machine, as a local build uses, at most the largest node's CPUs)")
    g.add_argument("--ray-encode-gpus", type=float, default=None, metavar="G",
                   help="GPUs of each encoder actor (default: 1 when the cluster has GPUs, else 0: CPU actors)")


def ray_options(args):
    """indexing.ray_build.RayOptions from the flags of add_ray_build_flags, or None without --ray."""
    if args.ray is None:
        return None
    from ..indexing.ray_build import RayBuildError, RayOptions  # deferred: --ray only; tqdm: +50 ms on --help

    for name in ("ray_ner_actors", "ray_encode_actors"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise RayBuildError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if (args.ray_encode_cpus is not None and args.ray_encode_cpus <= 0) or (args.ray_encode_gpus is not None and args.ray_encode_gpus < 0):
        raise RayBuildError("--ray-encode-cpus must be positive and --ray-encode-gpus not negative")
    return RayOptions(address=args.ray or None, ner_actors=args.ray_ner_actors, encode_actors=args.ray_encode_actors,
                      encode_cpus=args.ray_encode_cpus, encode_gpus=args.ray_encode_gpus)
