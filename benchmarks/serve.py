"""Load test of `linearrag serve`: closed-loop clients on 127.0.0.1, with dynamic batching and without.

    python -m benchmarks.serve --index DIR --questions FILE --json OUT [--png OUT]
                               [--concurrency 1 8 32 128] [--duration 20] [--overload-clients 512]

For each server configuration (dynamic batching: --max-batch-size 64; batching off: --max-batch-size 1),
the script starts `linearrag serve` as a child process on a free port, waits for /health, warms it up,
then for each concurrency C runs C clients, each sending one question per request and the next as soon
as the answer arrives, for --duration seconds (or --max-requests in all): throughput, latency
percentiles (of the whole phase, and of the requests sent in its second half, after the onset of the load;
the clients run in one process per 32 of them, --client-processes),
responses by status, mean batch size (from /metrics), the server's own view of the phase (its request and
queue-wait histograms: mean and the bucket bounds of p50 / p99) and the server's RSS.
Then, on the batching server, an overload phase: --overload-clients clients against
--max-concurrent (the largest concurrency), which must give only 200s and 429s with bounded RSS,
followed by a recovery phase at the first concurrency that must give only 200s.
Everything targets 127.0.0.1, every phase is bounded in time, and the servers are stopped (SIGTERM).
The clients share the machine with the server: on a 2-core machine their own CPU use is part of
what is measured (see benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import httpx
import torch

from benchmarks.common import machine
from linearrag_torch.client import retry_after_seconds
from linearrag_torch.corpus import read_questions
from linearrag_torch.retrieval.memory import status_bytes

DEFAULT_CONCURRENCY = (1, 8, 32, 128)
CLIENTS_PER_PROCESS = 32  # a client process holds at most this many connections by default (benchmarks/README.md)
MODES = {"batching": {"max_batch_size": 64, "max_wait_ms": 0.0}, "no_batching": {"max_batch_size": 1, "max_wait_ms": 0.0}}


# ------------------------------------------------------------------------------------------ the server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`linearrag serve` as a child process on 127.0.0.1."""

    def __init__(self, index: Path, device: str, max_batch_size: int, max_wait_ms: float, max_concurrent: int,
                 timeout: float, log: Path | None = None, extra_args: tuple = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "linearrag_torch.cli", "serve", str(index), "--port", str(self.port),
               "--device", device, "--max-batch-size", str(max_batch_size), "--max-wait-ms", str(max_wait_ms),
               "--max-concurrent", str(max_concurrent), "--timeout", str(timeout), "--log-level", "warning",
               *extra_args]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.log = open(log, "wb") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log)

    def wait_ready(self, limit_s: float = 300) -> float:
        t0 = time.perf_counter()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"linearrag serve exited with {self.proc.returncode} before it was ready")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                pass
            if time.perf_counter() - t0 > limit_s:
                raise RuntimeError(f"linearrag serve not ready after {limit_s} s")
            time.sleep(0.2)

    def memory(self) -> dict:
        """The server process's RSS and peak RSS, and the RSS of its child processes (NER workers, the
        multiprocessing resource tracker; Linux only, else None)."""
        children = None
        try:
            pids = [c for t in os.listdir(f"/proc/{self.proc.pid}/task")
                    for c in open(f"/proc/{self.proc.pid}/task/{t}/children").read().split()]
            children = sum(status_bytes("VmRSS", c) or 0 for c in pids)
        except OSError:
            pass
        return {"rss_bytes": status_bytes("VmRSS", self.proc.pid), "peak_rss_bytes": status_bytes("VmHWM", self.proc.pid),
                "children_rss_bytes": children}

    def metrics(self) -> dict:
        """The batch-size histogram's sum and count (questions, engine calls), and the server's own histograms of
        /v1/search 200s ("request") and of queue waits ("queue"): {"buckets": {le: cumulative count}, "sum", "count"}."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        vals = {}
        for line in text.splitlines():
            for name in ("linearrag_batch_size_questions_sum", "linearrag_batch_size_questions_count"):
                if line.startswith(name + " "):
                    vals[name.rsplit("_", 1)[1]] = float(line.split()[-1])
        for key, name, labels in (("request", "linearrag_request_duration_seconds", 'route="/v1/search",status="200"'),
                                  ("queue", "linearrag_queue_wait_seconds", "")):
            h = vals[key] = {"buckets": {}, "sum": 0.0, "count": 0.0}
            for line in text.splitlines():
                if not line.startswith(name) or (labels and labels not in line):
                    continue
                series, value = line.rsplit(" ", 1)
                if series.startswith(name + "_bucket"):
                    le = series.split('le="', 1)[1].split('"', 1)[0]
                    h["buckets"][float(le)] = float(value)
                elif series.startswith(name + "_sum"):
                    h["sum"] = float(value)
                elif series.startswith(name + "_count"):
                    h["count"] = float(value)
        return vals

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()
        return self.proc.returncode


# ------------------------------------------------------------------------------------------ the clients
async def closed_loop(url: str, questions: list[str], clients: int, duration: float, max_requests: int,
                      timeout: float, seed: int = 0, raw: bool = False, retry_after: bool = True) -> dict:
    """``clients`` concurrent clients, each sending its next request when the last one is answered; after a 429
    a client waits the server's Retry-After (``retry_after``, as SearchClient does) or only 10 ms (a retry
    storm). ``raw``: the result also holds the latencies themselves ("latencies_s", "second_half_s"), to merge
    several processes'. The clients are aiohttp's: per request they cost ~30x less CPU than httpx's
    AsyncClient (benchmarks/README.md), which matters where they share the server's cores."""
    rng = random.Random(seed)
    order = list(range(len(questions)))
    rng.shuffle(order)
    latencies, statuses = [], Counter()
    late = []  # latencies of the 200s sent in the second half of the phase (after the onset of the load)
    begin = time.perf_counter()
    sent = 0
    deadline = time.perf_counter() + duration

    async def client(i: int, http: aiohttp.ClientSession):
        nonlocal sent
        n = i
        while time.perf_counter() < deadline and sent < max_requests:
            sent += 1
            q = questions[order[n % len(order)]]
            n += clients
            t0 = time.perf_counter()
            try:
                async with http.post(url + "/v1/search", json={"question": q}) as r:
                    await r.read()
                statuses[str(r.status)] += 1
                if r.status == 200:
                    latencies.append(time.perf_counter() - t0)
                    if t0 - begin >= duration / 2:
                        late.append(latencies[-1])
                elif r.status == 429:
                    wait = retry_after_seconds(r.headers.get("Retry-After")) if retry_after else None
                    await asyncio.sleep(0.01 if wait is None else wait)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                statuses[type(exc).__name__] += 1

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    row = _row(clients, time.perf_counter() - t0, statuses, latencies, late)
    if raw:
        row.update(latencies_s=latencies, second_half_s=late)
    return row


def _one_process(job: tuple) -> dict:
    """A client process's share of a phase: waits for the common start time, then closed_loop (raw)."""
    start_at, url, questions, clients, duration, max_requests, timeout, seed, retry_after = job
    time.sleep(max(0.0, start_at - time.time()))
    return asyncio.run(closed_loop(url, questions, clients, duration, max_requests, timeout, seed, raw=True,
                                   retry_after=retry_after))


def load(url: str, questions: list[str], clients: int, duration: float, max_requests: int, timeout: float,
         processes: int = 1, retry_after: bool = True) -> dict:
    """closed_loop's row for ``clients`` clients spread over ``processes`` client processes (forked, started
    together; one process's event loop serving hundreds of connections on a small machine was the bottleneck
    and the tail of the measurement, not the server: benchmarks/README.md). Latencies are merged."""
    processes = max(1, min(processes, clients))
    if processes == 1:
        return asyncio.run(closed_loop(url, questions, clients, duration, max_requests, timeout,
                                       retry_after=retry_after))
    import multiprocessing

    shares = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    start_at = time.time() + 1.0
    jobs = [(start_at, url, questions, n, duration, max(1, max_requests // processes), timeout, i, retry_after)
            for i, n in enumerate(shares)]
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(processes) as pool:
        parts = pool.map(_one_process, jobs)
    latencies = [x for p in parts for x in p["latencies_s"]]
    late = [x for p in parts for x in p["second_half_s"]]
    statuses = Counter()
    for p in parts:
        statuses.update(p["statuses"])
    return {**_row(clients, max(p["seconds"] for p in parts), statuses, latencies, late), "client_processes": processes}


def _row(clients: int, wall: float, statuses: Counter, latencies: list, late: list) -> dict:
    """A phase's clients' figures: responses by status, throughput of the 200s, their latency percentiles over
    the phase and over its second half."""
    return {"clients": clients, "seconds": round(wall, 3), "requests": sum(statuses.values()),
            "ok": len(latencies), "statuses": dict(statuses),
            "throughput_qps": round(len(latencies) / wall, 2) if wall else None, **percentiles(latencies),
            "second_half": {"ok": len(late), **percentiles(late)}}


def client_processes(clients: int, setting: int) -> int:
    """--client-processes: as given, or (0) one process per 32 clients, at most 8."""
    return setting if setting > 0 else max(1, min(8, -(-clients // CLIENTS_PER_PROCESS)))


def percentiles(latencies: list[float]) -> dict:
    if not latencies:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "mean_ms": None}
    xs = sorted(latencies)

    def pct(p):
        return round(1000 * xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 2)

    return {"p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99), "mean_ms": round(1000 * sum(xs) / len(xs), 2)}


def phase(server: Server, name: str, questions, clients, args) -> dict:
    before = server.metrics()
    row = load(server.url, questions, clients, args.duration, args.max_requests, args.timeout,
               client_processes(clients, args.client_processes), retry_after=not args.retry_storm)
    after = server.metrics()
    calls = after.get("count", 0) - before.get("count", 0)
    row.update(phase=name, engine_calls=int(calls),
               mean_batch_size=round((after.get("sum", 0) - before.get("sum", 0)) / calls, 2) if calls else None,
               server=server_side(before, after), **server.memory())
    srv = row["server"]["request"]
    print(f"[serve] {name:>12} c={clients:<4} {row['throughput_qps']} q/s  p50 {row['p50_ms']} ms  p99 "
          f"{row['p99_ms']} ms  batch {row['mean_batch_size']}  {row['statuses']}  rss "
          f"{(row['rss_bytes'] or 0) / 2**20:.0f} MiB (children {(row['children_rss_bytes'] or 0) / 2**20:.0f} MiB)  "
          f"server: mean {srv['mean_ms']} ms, p99 <= {srv['p99_le_ms']} ms"
          f"  second half: p50 {row['second_half']['p50_ms']} p99 {row['second_half']['p99_ms']} ms",
          file=sys.stderr, flush=True)
    return row


def server_side(before: dict, after: dict) -> dict:
    """The phase as the server saw it, from the differences of its histograms: per histogram the mean and the
    bucket bounds that hold 50% and 99% of the observations (upper bounds: the histogram's resolution).
    Compared with the clients' own latencies it tells a tail in the server from one in the clients or HTTP."""
    out = {}
    for key in ("request", "queue"):
        a, b = after.get(key) or {}, before.get(key) or {}
        n = a.get("count", 0) - b.get("count", 0)
        row = {"count": int(n), "mean_ms": round(1000 * (a.get("sum", 0) - b.get("sum", 0)) / n, 1) if n else None}
        cum = sorted((le, c - b.get("buckets", {}).get(le, 0)) for le, c in a.get("buckets", {}).items())
        for q, field in ((0.5, "p50_le_ms"), (0.99, "p99_le_ms")):
            bound = next((le for le, c in cum if n and c >= q * n), None)
            row[field] = None if bound is None else (round(1000 * bound) if bound != float("inf") else "inf")
        out[key] = row
    return out


# ------------------------------------------------------------------------------------------ main
def run(args) -> dict:
    questions = [q["question"] for q in read_questions(args.questions)]
    if args.limit:
        questions = questions[:args.limit]
    max_concurrent = max(args.concurrency)
    result = {"date": _dt.date.today().isoformat(), "index": str(args.index), "questions": str(args.questions),
              "n_questions": len(questions), "device": args.device, "duration_s": args.duration,
              "server_args": args.server_args, "client": f"aiohttp {aiohttp.__version__}",
              "after_429": "10 ms" if args.retry_storm else "Retry-After",
              "max_concurrent": max_concurrent, "overload_clients": args.overload_clients,
              "machine": machine(torch.device(args.device), torch.get_num_threads()),  # the server's threads: --server-args
              "modes": {}, "overload": None}
    for mode, cfg in MODES.items():
        server = Server(args.index, args.device, cfg["max_batch_size"], cfg["max_wait_ms"], max_concurrent,
                        args.timeout, args.server_log, tuple(shlex.split(args.server_args)))
        try:
            ready_s = server.wait_ready()
            asyncio.run(closed_loop(server.url, questions, 4, min(2.0, args.duration), 50, args.timeout))  # warm-up
            rows = [phase(server, mode, questions, c, args) for c in args.concurrency]
            result["modes"][mode] = {"server": cfg, "ready_s": round(ready_s, 2), "rows": rows}
            if mode == "batching":
                over = phase(server, "overload", questions, args.overload_clients, args)
                recovery = phase(server, "recovery", questions, args.concurrency[0], args)
                statuses = set(over["statuses"])
                result["overload"] = {
                    "overload": over, "recovery": recovery,
                    "only_200_and_429": statuses <= {"200", "429"},
                    "recovered": set(recovery["statuses"]) == {"200"},
                    "rss_growth_bytes": (over["rss_bytes"] or 0) - (rows[-1]["rss_bytes"] or 0),
                }
        finally:
            result["modes"].setdefault(mode, {})["exit_code"] = server.stop()
    b = {r["clients"]: r for r in result["modes"]["batching"]["rows"]}
    n = {r["clients"]: r for r in result["modes"]["no_batching"]["rows"]}
    result["speedup"] = {str(c): round(b[c]["throughput_qps"] / n[c]["throughput_qps"], 2)
                         for c in b if c in n and b[c]["throughput_qps"] and n[c]["throughput_qps"]}
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, style in (("batching", "o-"), ("no_batching", "s--")):
        rows = result["modes"][mode]["rows"]
        cs = [r["clients"] for r in rows]
        ax1.plot(cs, [r["throughput_qps"] or 0 for r in rows], style, label=mode.replace("_", " "))
        ax2.plot(cs, [r["p50_ms"] or 0 for r in rows], style, label=f"{mode.replace('_', ' ')} p50")
        ax2.plot(cs, [r["p99_ms"] or 0 for r in rows], style, alpha=0.5, label=f"{mode.replace('_', ' ')} p99")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("questions / s")
    ax2.set_ylabel("latency, ms")
    ax2.set_yscale("log")
    ov = result.get("overload") or {}
    title = f"linearrag serve on {Path(result['index']).name} ({result['device']}, {result['machine']['cpu_count']} cores)"
    if ov:
        o = ov["overload"]
        title += f"; overload {o['clients']} clients: {o['statuses']}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, type=Path, help="index folder to serve")
    ap.add_argument("--questions", required=True, type=Path, help='JSON lines with "question"')
    ap.add_argument("--json", required=True, type=Path, help="write the results here")
    ap.add_argument("--png", type=Path, help="write the plot here (default: next to --json)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(DEFAULT_CONCURRENCY),
                    help="closed-loop client counts (default %(default)s); the largest is also --max-concurrent")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per phase (default %(default)s)")
    ap.add_argument("--max-requests", type=int, default=50_000, help="requests per phase at most (default %(default)s)")
    ap.add_argument("--overload-clients", type=int, default=512, help="clients of the overload phase (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=30.0, help="server and client timeout, s (default %(default)s)")
    ap.add_argument("--device", default="cpu", help="server device (default %(default)s)")
    ap.add_argument("--limit", type=int, help="use only the first N questions")
    ap.add_argument("--server-log", type=Path, help="append the servers' output to this file")
    ap.add_argument("--client-processes", type=int, default=0,
                    help="client processes per phase (default 0: one per 32 clients, at most 8)")
    ap.add_argument("--retry-storm", action="store_true",
                    help="after a 429, clients wait 10 ms instead of the server's Retry-After")
    ap.add_argument("--server-args", default="", help='more `linearrag serve` flags for both servers, e.g. "--threads 1"')
    args = ap.parse_args(argv)
    if args.overload_clients <= max(args.concurrency):
        ap.error("--overload-clients must be larger than the largest --concurrency (the server's --max-concurrent)")
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    plot(result, args.png or args.json.with_suffix(".png"))
    print(json.dumps({"speedup_batching_over_off": result["speedup"],
                      "overload_only_200_and_429": result["overload"]["only_200_and_429"],
                      "recovered": result["overload"]["recovered"]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
