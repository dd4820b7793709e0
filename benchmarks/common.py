"""What the benchmarks share: timing, device sync, peak memory, machine info, the synthetic graph with
2WikiMultiHopQA's statistics, and the meter of the PageRank steps. Each benchmark is then
prepare (arguments, device, inputs) -> run (the measurements, as rows) -> report (JSON, plot, log).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time

import numpy as np
import torch

from linearrag_torch.retrieval.engine import DeviceGraph
from linearrag_torch.kernels.backends import numba_available, torch_scatter_available, triton_available
from linearrag_torch.env import native_bf16
from linearrag_torch.queries import EncodedQueries
from linearrag_torch.retrieval.memory import status_bytes
from linearrag_torch.synthetic import index_from_mentions, random_embeddings, random_mentions

# used when no real corpus was measured: the generator calibrated on 2WikiMultiHopQA in our run
# (benchmarks/results/scaling_cpu.json, "generator")
DEFAULT_STATS = {"sentences_per_passage": 4.53, "entities_per_sentence": 4.375, "vocabulary_per_passage": 23.07,
                 "zipf": 0.68, "extra_ratio": 2.63, "repeat": 0.705}


def log(msg: str) -> None:
    print(msg, flush=True)


def setting_overrides(items: list, flag: str, error) -> dict:
    """{field: value} from a command line's FIELD=VALUE items (``flag``, e.g. --set): VALUE as JSON where it parses
    (0, 0.5, true, "paper"), true / false in any case, else the string itself; ``error(message)`` (an argparse
    parser's error) for an item without '='."""
    out = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or not field:
            error(f"{flag} expects FIELD=VALUE, got {item!r}")
        try:
            out[field] = json.loads(value)
        except json.JSONDecodeError:
            out[field] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when torch sees it, else the CPU; anything else as torch.device reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# ----------------------------------------------------------------------------------------- timing
def sync(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeat: int = 5) -> float:
    """Median milliseconds of fn() over ``repeat`` runs after one warm-up (CUDA events on a GPU)."""
    fn()
    out = []
    for _ in range(repeat):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize(device)
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


# ----------------------------------------------------------------------------------------- memory
def reset_peak_memory(device: torch.device) -> int:
    """Start a peak-memory window; returns the current usage (RSS on CPU, allocated bytes on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # "5" resets the peak RSS (VmHWM) of this process
            fh.write("5")
    except OSError:
        pass
    return _status_bytes("VmRSS")


def peak_memory(device: torch.device) -> int:
    """Peak usage since reset_peak_memory (peak RSS on CPU, peak allocated bytes on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return _status_bytes("VmHWM")


def _status_bytes(field: str) -> int:
    return status_bytes(field) or 0


def cgroup_memory() -> dict:
    """This process's memory cgroup (Linux, cgroup v1 or v2): its limit and the most it has held since made (page
    cache of the files it read included, which the kernel reclaims before it refuses memory), in bytes; {} where
    none can be read. A run in a cgroup limited to N bytes shows that it fits in N."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = [line.rstrip("\n").split(":", 2) for line in fh]
    except OSError:
        return {}
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):  # v1
            base = f"/sys/fs/cgroup/memory{path}"
            files = {"limit_bytes": "memory.limit_in_bytes", "max_usage_bytes": "memory.max_usage_in_bytes",
                     "limit_hits": "memory.failcnt"}
            break
    else:
        path = next((p for h, c, p in lines if h == "0" and c == ""), None)
        if path is None:
            return {}
        base = f"/sys/fs/cgroup{path}"
        files = {"limit_bytes": "memory.max", "max_usage_bytes": "memory.peak"}
    out = {"path": path}
    for key, name in files.items():
        try:
            with open(f"{base}/{name}") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        out[key] = None if text == "max" or (key == "limit_bytes" and int(text) >= 1 << 62) else int(text)
    return out


class MemorySampler:
    """The largest anonymous and file-backed resident memory of this process while the block runs, read from
    /proc/self/status every ``interval`` seconds by a thread (the kernel keeps a peak of the total only, VmHWM; an
    index read from a folder is mapped from its files, whose resident pages the kernel can drop and reread, so the
    two are reported apart). A sample can miss a peak shorter than the interval.

        with MemorySampler() as mem:
            work()
        mem.peak_anonymous, mem.peak_file
    """

    def __init__(self, interval: float = 0.02):
        import threading

        self.interval = interval
        self.peak_anonymous = self.peak_file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak_anonymous = max(self.peak_anonymous, _status_bytes("RssAnon"))
        self.peak_file = max(self.peak_file, _status_bytes("RssFile"))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "MemorySampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# ----------------------------------------------------------------------------------------- machine
def machine(device: torch.device, threads: int) -> dict:
    """Versions and hardware for a result file."""
    d = {"cpu_count": os.cpu_count(), "torch_threads": threads, "torch": torch.__version__,
         "numpy": np.__version__, "python": platform.python_version(), "platform": platform.platform(),
         "device": str(device)}
    try:
        import scipy

        d["scipy"] = scipy.__version__
    except ImportError:
        pass
    if numba_available():  # the local PageRank's push on CPU tensors (kernels/push.py)
        import numba

        d["numba"] = numba.__version__
    d["cpu"] = cpu_model()
    get_capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if get_capability is not None:  # the kernels torch dispatches to: AVX512 / AVX2 (capped by ATEN_CPU_CAPABILITY)
        d["torch_cpu_capability"] = str(get_capability())
    d["native_bf16"] = native_bf16("cpu")  # the kernels' bf16: native (AVX512-BF16, AMX) or emulated
    if device.type == "cuda":
        d["gpu"] = torch.cuda.get_device_name(device)
        d["description"] = f"{d['gpu']}"
    else:
        d["description"] = (f"{os.cpu_count()} cores {d['cpu']}, {threads} torch thread(s), "
                            f"{'native' if d['native_bf16'] else 'no native'} bf16 kernels")
    return d


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform.processor())."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def kernel_backends() -> dict:
    """Which optional kernel backends import here (kernels/backends.py)."""
    return {"triton": triton_available(), "torch_scatter": torch_scatter_available(), "numba": numba_available()}


# ----------------------------------------------------------------------------------------- synthetic graph
def synthetic_mentions(passages: int, stats: dict, seed: int = 0):
    """random_mentions with the statistics ``stats`` (DEFAULT_STATS or a calibration of scaling.py)."""
    return random_mentions(passages, max(1, round(stats["vocabulary_per_passage"] * passages)),
                           stats["sentences_per_passage"], stats["entities_per_sentence"], stats["zipf"],
                           stats["extra_ratio"], repeat=stats.get("repeat", 0.0), seed=seed)


def synthetic_embeddings(m, dim: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> list:
    """Random unit vectors for the passages, sentences and entities of mentions ``m`` (seeds seed+1..3), stored in
    ``dtype`` (an index's embedding dtype)."""
    return [random_embeddings(n, dim, seed + i + 1, dtype=dtype)
            for i, n in enumerate((m.passages, m.sentences, m.entities))]


def make_graph(passages: int, dim: int, device, seed: int = 0, stats: dict = DEFAULT_STATS):
    """A synthetic index with the 2WikiMultiHopQA-calibrated statistics, and its device graph with the
    PageRank operator built: (index, graph)."""
    m = synthetic_mentions(passages, stats, seed)
    index = index_from_mentions(m, *synthetic_embeddings(m, dim, seed))
    graph = DeviceGraph(index, device)
    graph.ppr_graph(False)
    return index, graph


# ----------------------------------------------------------------------------------------- PageRank steps
def ppr_step_bytes(graph, B: int) -> int:
    """Memory traffic of one kernels.ppr_step on B columns if nothing is reused from cache: each CSR
    entry's index and value, each gathered row of x (B floats), and per output row the reset and old
    iterate read and the new iterate written."""
    total = 0
    for mat in (graph.to_passages, graph.to_entities, graph.between_passages):
        if mat is None:
            continue
        rows = mat.shape[0]
        nnz = mat.values().numel()
        ib = mat.col_indices().element_size()
        total += nnz * (ib + 4) + (rows + 1) * ib + nnz * B * 4 + rows * B * 4 * 3
    return total


class StepMeter:
    """Sums the PageRank steps of traced calls (engine.retrieve(..., trace="steps") returns them in
    Trace.ppr_steps): ``add(trace)`` after each call (outside its timing); ``calls`` steps, ``bytes`` their modeled
    traffic (ppr_step_bytes), ``ms()`` their time (CUDA events on a GPU, read once at the end)."""

    def __init__(self, device):
        self.device, self.bytes, self.calls = device, 0, 0
        self._logs = []
        self.stage_s = {}  # seconds per part of the graph rounds (StepLog.stage_s)
        self.pushes = []  # local PageRank calls (StepLog.pushes: local_ppr.PushStats)

    def add(self, trace) -> None:
        log = trace.ppr_steps
        for k, v in getattr(log, "stage_s", {}).items():
            self.stage_s[k] = self.stage_s.get(k, 0.0) + v
        self.pushes += list(getattr(log, "pushes", []))
        self.calls += len(log)
        self.bytes += sum(ppr_step_bytes(st.walk, st.columns.numel()) for st in log)
        for st in log.steps:  # keep the time marks only (a step's operator may be a per-call copy of the walk)
            st.walk = st.columns = st.change = None
        self._logs.append(log)

    def ms(self) -> float:
        return 1e3 * sum(sum(log.seconds()) for log in self._logs)


def tile_queries(enc, n: int):
    """n encoded questions: those of ``enc`` (an EncodedQueries) repeated as often as needed (question i is
    question i mod B), to time a batch larger than a question set."""
    B = enc.batch_size
    reps = -(-n // B)
    rows = None if enc.entity_rows is None else enc.entity_rows.repeat(reps)
    big = EncodedQueries(enc.query_emb.repeat(reps, 1), enc.entity_emb.repeat(reps, 1),
                         torch.cat([enc.entity_owner + c * B for c in range(reps)]), list(enc.entity_text) * reps,
                         rows, enc.rows_of)
    return big if reps * B == n else big.slice(0, n)
