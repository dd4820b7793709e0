"""Load test of `linearrag serve`: closed-loop clients on 127.0.0.1, with dynamic batching and without.

    python -m benchmarks.serve --index DIR --questions FILE --json OUT [--png OUT]
                               [--concurrency 1 8 32 128] [--duration 20] [--overload-clients 512]
    python -m benchmarks.serve --overload --max-concurrent 16 [--overload-factors 4 16] --index ... --json OUT
    python -m benchmarks.serve --soak 1200 --max-concurrent 16 [--reload-every 120] --index ... --json OUT

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
With --overload (one batching server, --max-concurrent M): capacity with M closed-loop clients, then for each
of --overload-factors (4 16) that many times M clients, aggressive (10 ms after a 429 / 503, Retry-After
ignored) and well-behaved (SearchClient's jittered backoff and retry budget), then recovery with M clients:
goodput (200s / s) against the capacity of the same run, p50 / p99 of the 200s, statuses, RSS, judged against
issue 28's targets. With --soak SECONDS: capacity, then Poisson arrivals of requests of 1, 4 or 16 questions at
--soak-load (0.7) of it against a server at its default --max-concurrent (--soak-max-concurrent), a reload
every --reload-every s (120), the server's RSS and open files (sockets apart) sampled: failed
requests, RSS slopes (whole run, second half), open-fd slopes (all, non-socket), the fds left once the clients
have closed their connections, p99 per window and its drift. Both write JSON and a plot.
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
from linearrag_torch.client import RetryBudget, backoff, retry_after_seconds
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
                 timeout: float, log: Path | None = None, extra_args: tuple = (), code: Path | None = None):
        """``code``: run the server from this checkout of the repository (another commit's worktree) instead of
        the installed package."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "linearrag_torch.cli", "serve", str(Path(index).resolve()), "--port",
               str(self.port),
               "--device", device, "--max-batch-size", str(max_batch_size), "--max-wait-ms", str(max_wait_ms),
               *(("--max-concurrent", str(max_concurrent)) if max_concurrent else ()), "--timeout", str(timeout),
               "--log-level", "warning", *extra_args]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        cwd = None
        if code is not None:  # (python -m puts the working folder first on the path: the checkout's package wins)
            cwd = env["PYTHONPATH"] = str(Path(code).resolve())
        self.log = open(log, "wb") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log, cwd=cwd)

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

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) the server process has used, all its threads (Linux only, else None)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def fd_kinds(self) -> dict:
        """The server's open file descriptors, all and split: sockets (the clients' connections, which a client's
        keep-alive pool holds open between requests, and the listening socket) and the rest (files, pipes, event
        fds: what a leak of the server's own would grow). Linux only, else None each."""
        counts = {"open_fds": None, "open_sockets": None, "open_other_fds": None}
        try:
            fd_dir = f"/proc/{self.proc.pid}/fd"
            targets = []
            for fd in os.listdir(fd_dir):
                try:
                    targets.append(os.readlink(f"{fd_dir}/{fd}"))
                except OSError:  # closed between the listing and the read
                    pass
        except OSError:
            return counts
        sockets = sum(t.startswith("socket:") for t in targets)
        return {"open_fds": len(targets), "open_sockets": sockets, "open_other_fds": len(targets) - sockets}

    def metrics(self) -> dict:
        """The batch-size histogram's sum and count (questions, engine calls), and the server's own histograms of
        /v1/search 200s ("request") and of queue waits ("queue"): {"buckets": {le: cumulative count}, "sum", "count"}."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        vals = {}
        for line in text.splitlines():
            for name in ("linearrag_batch_size_questions_sum", "linearrag_batch_size_questions_count"):
                if line.startswith(name + " "):
                    vals[name.rsplit("_", 1)[1]] = float(line.split()[-1])
            if line.startswith("linearrag_engine_seconds_sum "):
                vals["engine_seconds"] = float(line.split()[-1])
            elif line.startswith('linearrag_stage_seconds_sum{stage="'):
                stage = line.split('"', 2)[1]
                vals.setdefault("stages", {})[stage] = float(line.split()[-1])
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
AFTER_REFUSAL = ("retry-after", "backoff", "storm")


async def closed_loop(url: str, questions: list[str], clients: int, duration: float, max_requests: int,
                      timeout: float, seed: int = 0, raw: bool = False, after_refusal: str = "retry-after") -> dict:
    """``clients`` concurrent clients, each sending its next request when the last one is answered. After a 429
    or 503 a client waits (``after_refusal``): "retry-after", the server's Retry-After; "backoff", as
    SearchClient does (jittered exponential backoff, at least the Retry-After, a retry budget per client: when
    it is spent the question is given up, counted in "given_up", and the client still waits before its next);
    "storm", only 10 ms, ignoring Retry-After (an aggressive client). ``raw``: the result also holds the
    latencies themselves ("latencies_s", "second_half_s"), to merge several processes'. The clients are
    aiohttp's: per request they cost ~30x less CPU than httpx's AsyncClient (benchmarks/README.md), which
    matters where they share the server's cores."""
    if after_refusal not in AFTER_REFUSAL:
        raise ValueError(f"after_refusal must be one of {AFTER_REFUSAL}, got {after_refusal!r}")
    rng = random.Random(seed)
    order = list(range(len(questions)))
    rng.shuffle(order)
    latencies, statuses = [], Counter()
    late = []  # latencies of the 200s sent in the second half of the phase (after the onset of the load)
    begin = time.perf_counter()
    sent = 0
    deadline = time.perf_counter() + duration

    given_up = 0

    async def client(i: int, http: aiohttp.ClientSession):
        nonlocal sent, given_up
        n = i
        attempt = 0  # refusals in a row of the current question
        budget = RetryBudget()
        crng = random.Random(seed * 100_003 + i)
        while time.perf_counter() < deadline and sent < max_requests:
            sent += 1
            q = questions[order[n % len(order)]]
            t0 = time.perf_counter()
            try:
                async with http.post(url + "/v1/search", json={"question": q}) as r:
                    await r.read()
                statuses[str(r.status)] += 1
                if r.status == 200:
                    latencies.append(time.perf_counter() - t0)
                    if t0 - begin >= duration / 2:
                        late.append(latencies[-1])
                    budget.on_success()
                    n, attempt = n + clients, 0
                elif r.status in (429, 503):
                    given = retry_after_seconds(r.headers.get("Retry-After"))
                    if after_refusal == "storm":
                        wait = 0.01
                    elif after_refusal == "retry-after":
                        wait = 0.01 if given is None else given
                    else:
                        wait = backoff(attempt, given, rng=crng)
                        attempt += 1
                        if not budget.on_failure():  # the question is given up; the next one after the wait
                            given_up += 1
                            n, attempt = n + clients, 0
                    await asyncio.sleep(min(wait, max(0.0, deadline - time.perf_counter())))
                else:
                    n, attempt = n + clients, 0
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                statuses[type(exc).__name__] += 1
                await asyncio.sleep(0.01)

    t0, cpu0 = time.perf_counter(), time.process_time()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    row = _row(clients, time.perf_counter() - t0, statuses, latencies, late)
    row["given_up"] = given_up
    row["client_cpu_s"] = round(time.process_time() - cpu0, 3)  # this client process's CPU in the phase
    if raw:
        row.update(latencies_s=latencies, second_half_s=late)
    return row


def _one_process(job: tuple) -> dict:
    """A client process's share of a phase: waits for the common start time, then closed_loop (raw)."""
    start_at, url, questions, clients, duration, max_requests, timeout, seed, after_refusal, nice = job
    if nice:  # absolute, in this client process only (a pool worker may take two jobs)
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    time.sleep(max(0.0, start_at - time.time()))
    return asyncio.run(closed_loop(url, questions, clients, duration, max_requests, timeout, seed, raw=True,
                                   after_refusal=after_refusal))


def load(url: str, questions: list[str], clients: int, duration: float, max_requests: int, timeout: float,
         processes: int = 1, after_refusal: str = "retry-after", nice: int = 0) -> dict:
    """closed_loop's row for ``clients`` clients spread over ``processes`` client processes (forked, started
    together; one process's event loop serving hundreds of connections on a small machine was the bottleneck
    and the tail of the measurement, not the server: benchmarks/README.md). Latencies are merged."""
    processes = max(1, min(processes, clients))
    if processes == 1 and not nice:  # (a niced share runs in a client process of its own)
        return asyncio.run(closed_loop(url, questions, clients, duration, max_requests, timeout,
                                       after_refusal=after_refusal))
    import multiprocessing

    shares = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    start_at = time.time() + 1.0
    jobs = [(start_at, url, questions, n, duration, max(1, max_requests // processes), timeout, i, after_refusal,
             nice) for i, n in enumerate(shares)]
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ctx.Pool(processes) as pool:
        parts = pool.map(_one_process, jobs)
    latencies = [x for p in parts for x in p["latencies_s"]]
    late = [x for p in parts for x in p["second_half_s"]]
    statuses = Counter()
    for p in parts:
        statuses.update(p["statuses"])
    return {**_row(clients, max(p["seconds"] for p in parts), statuses, latencies, late),
            "given_up": sum(p["given_up"] for p in parts), "client_processes": processes,
            "client_cpu_s": round(sum(p["client_cpu_s"] for p in parts), 3)}


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


def cpu_split(row: dict, before: dict, after: dict, cpu0, cpu1) -> dict:
    """Where a phase's core-seconds went: the server process's CPU seconds, the client processes' (their own
    count), the engine's busy seconds (the sum of its calls' durations, /metrics), the machine's core-seconds
    (cores x the phase's wall time), and the engine's milliseconds per answered question by stage."""
    wall = row["seconds"]
    engine = after.get("engine_seconds", 0.0) - before.get("engine_seconds", 0.0)
    stages0 = before.get("stages", {})
    return {"server_cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2),
            "engine_busy_s": round(engine, 2), "engine_busy_share": round(engine / wall, 3) if wall else None,
            "core_s": round((os.cpu_count() or 1) * wall, 2),
            "stage_ms_per_question": {k: round((v - stages0.get(k, 0.0)) / max(row["ok"], 1) * 1e3, 3)
                                      for k, v in after.get("stages", {}).items()}}


def phase(server: Server, name: str, questions, clients, args, after_refusal: str | None = None) -> dict:
    before, cpu0 = server.metrics(), server.cpu_seconds()
    after_refusal = after_refusal or ("storm" if args.retry_storm else "retry-after")
    row = load(server.url, questions, clients, args.duration, args.max_requests, args.timeout,
               client_processes(clients, args.client_processes), after_refusal=after_refusal,
               nice=getattr(args, "client_nice", 0))
    after, cpu1 = server.metrics(), server.cpu_seconds()
    calls = after.get("count", 0) - before.get("count", 0)
    row.update(phase=name, after_refusal=after_refusal, engine_calls=int(calls),
               mean_batch_size=round((after.get("sum", 0) - before.get("sum", 0)) / calls, 2) if calls else None,
               server=server_side(before, after), **server.memory(), **cpu_split(row, before, after, cpu0, cpu1))
    srv = row["server"]["request"]
    print(f"[serve] {name:>12} c={clients:<4} {row['throughput_qps']} q/s  p50 {row['p50_ms']} ms  p99 "
          f"{row['p99_ms']} ms  batch {row['mean_batch_size']}  {row['statuses']}  rss "
          f"{(row['rss_bytes'] or 0) / 2**20:.0f} MiB (children {(row['children_rss_bytes'] or 0) / 2**20:.0f} MiB)  "
          f"server: mean {srv['mean_ms']} ms, p99 <= {srv['p99_le_ms']} ms"
          f"  second half: p50 {row['second_half']['p50_ms']} p99 {row['second_half']['p99_ms']} ms"
          f"  cpu s: server {row['server_cpu_s']} clients {row.get('client_cpu_s')} of {row['core_s']}, engine busy "
          f"{row['engine_busy_share']}", file=sys.stderr, flush=True)
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


# ------------------------------------------------------------------------------------------ overload mode
OVERLOAD_BEHAVIOURS = (("aggressive", "storm"), ("well-behaved", "backoff"))
TARGETS = {"aggressive": 0.70, "well-behaved": 0.90, "p99_ms": 2000.0, "rss_growth": 0.10}


def start_server(args, questions, max_concurrent: int | None = None) -> tuple[Server, float]:
    """The batching server (--max-batch-size 64) with ``max_concurrent`` (None: the server's default), ready and
    warmed up."""
    server = Server(args.index, args.device, MODES["batching"]["max_batch_size"], MODES["batching"]["max_wait_ms"],
                    max_concurrent, args.timeout, args.server_log, tuple(shlex.split(args.server_args)))
    ready_s = server.wait_ready()
    asyncio.run(closed_loop(server.url, questions, 4, min(2.0, args.duration), 50, args.timeout))  # warm-up
    return server, ready_s


def run_overload(args, questions: list[str]) -> dict:
    """One server: capacity (--max-concurrent closed-loop clients), then each of --overload-factors times more
    clients, aggressive (10 ms after a refusal) and well-behaved (SearchClient's backoff), then recovery at
    capacity. Goodput = 200s per second, beside the capacity of the same run."""
    m = args.max_concurrent
    result = {"date": _dt.date.today().isoformat(), "mode": "overload", "index": str(args.index),
              "questions": str(args.questions), "n_questions": len(questions), "device": args.device,
              "duration_s": args.duration, "max_concurrent": m, "server_args": args.server_args,
              "client": f"aiohttp {aiohttp.__version__}", "client_nice": args.client_nice, "targets": TARGETS,
              "machine": machine(torch.device(args.device), torch.get_num_threads())}
    server, ready_s = start_server(args, questions, args.max_concurrent)
    try:
        result["ready_s"] = round(ready_s, 2)
        cap = phase(server, "capacity", questions, m, args, "retry-after")
        capacity = cap["throughput_qps"] or 0.0
        rows = [cap]
        for factor in args.overload_factors:
            for behaviour, policy in OVERLOAD_BEHAVIOURS:
                row = phase(server, f"{factor}x {behaviour}", questions, factor * m, args, policy)
                row.update(factor=factor, behaviour=behaviour, **judge(row, cap, behaviour))
                rows.append(row)
        rec = phase(server, "recovery", questions, m, args, "retry-after")
        rec.update(goodput_share=round(rec["throughput_qps"] / capacity, 3) if capacity else None,
                   recovered=set(rec["statuses"]) == {"200"} and bool(capacity)
                   and rec["throughput_qps"] >= TARGETS["well-behaved"] * capacity)
        rows.append(rec)
        result.update(capacity_qps=capacity, phases=rows)
    finally:
        result["exit_code"] = server.stop()
    over = [r for r in result.get("phases", []) if "factor" in r]
    result["all_targets_met"] = bool(over) and all(r["targets_met"] for r in over) and result["phases"][-1]["recovered"]
    return result


def judge(row: dict, cap: dict, behaviour: str) -> dict:
    """An overload phase against issue 28's targets: goodput share of capacity, p99 of the admitted (200s),
    only 200 / 429 / 503, RSS within 10% of the capacity phase's."""
    capacity = cap["throughput_qps"] or 0.0
    share = round(row["throughput_qps"] / capacity, 3) if capacity else None
    rss_growth = ((row["rss_bytes"] or 0) - (cap["rss_bytes"] or 0)) / cap["rss_bytes"] if cap["rss_bytes"] else None
    checks = {"goodput": share is not None and share >= TARGETS[behaviour],
              "p99": row["p99_ms"] is not None and row["p99_ms"] <= TARGETS["p99_ms"],
              "statuses": set(row["statuses"]) <= {"200", "429", "503"},
              "rss": rss_growth is not None and rss_growth <= TARGETS["rss_growth"]}
    return {"goodput_qps": row["throughput_qps"], "goodput_share": share,
            "rss_growth": None if rss_growth is None else round(rss_growth, 4), "checks": checks,
            "targets_met": all(checks.values())}


def plot_overload(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.get("phases", [])
    names = [r["phase"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
    ax1.bar(names, [r["throughput_qps"] or 0 for r in rows], color=["tab:gray"] + ["tab:red" if r.get(
        "behaviour") == "aggressive" else "tab:blue" for r in rows[1:-1]] + ["tab:gray"])
    cap = result.get("capacity_qps") or 0
    for share, style in ((1.0, "-"), (TARGETS["well-behaved"], "--"), (TARGETS["aggressive"], ":")):
        ax1.axhline(share * cap, color="k", linestyle=style, linewidth=0.8, label=f"{share:.0%} of capacity")
    ax1.set_ylabel("goodput (200s / s)")
    ax1.legend(fontsize=7)
    ax2.bar([n + " p50" for n in names], [r["p50_ms"] or 0 for r in rows], color="tab:green")
    ax2.bar([n + " p99" for n in names], [r["p99_ms"] or 0 for r in rows], color="tab:orange")
    ax2.axhline(TARGETS["p99_ms"], color="k", linestyle="--", linewidth=0.8)
    ax2.set_ylabel("latency of the 200s, ms")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"linearrag serve under overload on {Path(result['index']).name}: --max-concurrent "
                 f"{result['max_concurrent']}, capacity {cap} q/s ({result['machine']['cpu_count']} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ------------------------------------------------------------------------------------------ soak mode
SOAK_SIZES = ((1, 0.6), (4, 0.3), (16, 0.1))  # questions per request, and its share of the requests
SOAK_RETRIES = 4  # a refused soak request is sent again (SearchClient's backoff) at most this many times


def run_soak(args, questions: list[str]) -> dict:
    """--soak SECONDS on one server: capacity (questions / s, --max-concurrent closed-loop clients for
    --soak-capacity-s), then Poisson arrivals of requests of 1, 4 or 16 questions at --soak-load of that capacity,
    a reload every --reload-every s; the server's RSS and open files sampled every --sample-every s."""
    sizes = [n for n, _ in SOAK_SIZES]
    weights = [w for _, w in SOAK_SIZES]
    mean_size = sum(n * w for n, w in SOAK_SIZES)
    result = {"date": _dt.date.today().isoformat(), "mode": "soak", "index": str(args.index),
              "questions": str(args.questions), "device": args.device, "soak_s": args.soak,
              "max_concurrent": args.max_concurrent, "server_max_concurrent": args.soak_max_concurrent or "default",
              "load_share": args.soak_load, "sizes": SOAK_SIZES,
              "reload_every_s": args.reload_every, "server_args": args.server_args,
              "machine": machine(torch.device(args.device), torch.get_num_threads())}
    server, ready_s = start_server(args, questions, args.soak_max_concurrent)
    try:
        cap_args = argparse.Namespace(**{**vars(args), "duration": args.soak_capacity_s})
        cap = phase(server, "capacity", questions, args.max_concurrent, cap_args, "retry-after")
        capacity = cap["throughput_qps"] or 1.0
        rate = args.soak_load * capacity / mean_size  # requests per second
        result.update(ready_s=round(ready_s, 2), capacity_qps=capacity, requests_per_s=round(rate, 3))
        print(f"[soak] capacity {capacity} q/s: {rate:.2f} requests/s of mean {mean_size:.1f} questions for "
              f"{args.soak} s, reload every {args.reload_every} s", file=sys.stderr, flush=True)
        result.update(asyncio.run(soak_load(server, questions, rate, sizes, weights, args)))
    finally:
        result["exit_code"] = server.stop()
    return result


async def soak_load(server: Server, questions: list[str], rate: float, sizes, weights, args) -> dict:
    rng = random.Random(0)
    records = []  # (seconds since start, size, latency s, status)
    samples = []  # {"t", "rss_bytes", "children_rss_bytes", "open_fds", "open_sockets", "open_other_fds", "in_flight"}
    reloads = []
    outstanding = set()
    cap = 8 * args.max_concurrent  # requests in flight at most (an unbounded open loop would be a memory test)
    skipped = 0
    t0 = time.perf_counter()
    end = t0 + args.soak

    retried = Counter()

    async def one(http, size):
        """A request as SearchClient sends it: a 429 / 503 is sent again after its backoff (at most
        SOAK_RETRIES times); the latency runs from the first attempt."""
        qs = [questions[rng.randrange(len(questions))] for _ in range(size)]
        t = time.perf_counter()
        for attempt in range(SOAK_RETRIES + 1):
            try:
                async with http.post(server.url + "/v1/search", json={"questions": qs}) as r:
                    await r.read()
                    status = str(r.status)
                    given = retry_after_seconds(r.headers.get("Retry-After"))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                status, given = type(exc).__name__, None
            if status not in ("429", "503") or attempt == SOAK_RETRIES:
                break
            retried[status] += 1
            await asyncio.sleep(backoff(attempt, given, rng=rng))
        records.append((round(t - t0, 3), size, time.perf_counter() - t, status))

    async def reloader(http):
        while True:
            await asyncio.sleep(args.reload_every)
            if time.perf_counter() >= end:
                return
            t = time.perf_counter()
            try:
                async with http.post(server.url + "/admin/reload") as r:
                    await r.read()
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                status = type(exc).__name__
            reloads.append({"t": round(t - t0, 1), "status": status, "seconds": round(time.perf_counter() - t, 2)})

    async def sampler():
        while True:
            mem = server.memory()
            samples.append({"t": round(time.perf_counter() - t0, 1), "rss_bytes": mem["rss_bytes"],
                            "children_rss_bytes": mem["children_rss_bytes"], **server.fd_kinds(),
                            "in_flight": len(outstanding)})
            if time.perf_counter() >= end:
                return
            await asyncio.sleep(min(args.sample_every, max(0.0, end - time.perf_counter())))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=cap),
                                     timeout=aiohttp.ClientTimeout(total=args.timeout + 10)) as http:
        helpers = [asyncio.ensure_future(reloader(http)), asyncio.ensure_future(sampler())]
        next_at = time.perf_counter()
        while True:
            next_at += rng.expovariate(rate)
            now = time.perf_counter()
            if next_at >= end:
                break
            if next_at > now:
                await asyncio.sleep(next_at - now)
            if len(outstanding) >= cap:
                skipped += 1
                continue
            task = asyncio.ensure_future(one(http, rng.choices(sizes, weights)[0]))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
        if outstanding:
            await asyncio.wait(outstanding, timeout=args.timeout + 15)
        await helpers[1]
        helpers[0].cancel()
    # the clients' keep-alive connections are closed with the session: what stays open after is the server's own
    await asyncio.sleep(2.0)
    after = {"t": round(time.perf_counter() - t0, 1), **server.fd_kinds()}
    return {**soak_report(records, samples, reloads, skipped, args), "fds_after_clients_closed": after,
            "refusals_retried": dict(retried)}


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per minute."""
    pts = [(t, v) for t, v in points if v is not None]
    if len(pts) < 2:
        return None
    import numpy as np

    t, v = np.array(pts, dtype=float).T
    if t.max() == t.min():
        return None
    return float(np.polyfit(t / 60.0, v, 1)[0])


def soak_report(records, samples, reloads, skipped, args) -> dict:
    statuses = Counter(r[3] for r in records)
    window = max(10.0, args.soak / 20)  # p99 over windows of this many seconds
    windows = []
    for k in range(int(args.soak // window) + 1):
        lat = [r[2] for r in records if k * window <= r[0] < (k + 1) * window and r[3] == "200"]
        if lat:
            windows.append({"t": round(k * window, 1), "n": len(lat), **percentiles(lat)})
    p99s = [(w["t"], w["p99_ms"]) for w in windows if w["n"] >= 20] or [(w["t"], w["p99_ms"]) for w in windows]
    by_size = {}
    for n, _ in SOAK_SIZES:
        lat = [r[2] for r in records if r[1] == n and r[3] == "200"]
        by_size[str(n)] = {"ok": len(lat), **percentiles(lat)}
    rss = [(s["t"], s["rss_bytes"]) for s in samples]
    fds = [(s["t"], s["open_fds"]) for s in samples]
    other = [(s["t"], s["open_other_fds"]) for s in samples]
    return {
        "requests": len(records), "statuses": dict(statuses),
        "failed": sum(v for k, v in statuses.items() if k != "200"), "skipped_at_client_cap": skipped,
        "latency_by_size": by_size, "p99_windows": windows, "window_s": window,
        "p99_drift": {"first_ms": p99s[0][1] if p99s else None, "last_ms": p99s[-1][1] if p99s else None,
                      "slope_ms_per_min": slope_per_minute(p99s)},
        "rss_slope_bytes_per_min": slope_per_minute(rss), "open_fds_slope_per_min": slope_per_minute(fds),
        # the second half alone: the first minutes hold the warm-up (allocator arenas, caches) a leak is not
        "rss_slope_second_half_bytes_per_min": slope_per_minute([(t, v) for t, v in rss if t >= args.soak / 2]),
        "rss_first_last": [rss[0][1], rss[-1][1]] if rss else None,
        "open_fds_first_last": [fds[0][1], fds[-1][1]] if fds else None,
        "open_other_fds_slope_per_min": slope_per_minute(other),
        "open_other_fds_first_last": [other[0][1], other[-1][1]] if other else None,
        "open_sockets_max": max((s["open_sockets"] or 0 for s in samples), default=None),
        "reloads": reloads, "reloads_ok": sum(r["status"] == 200 for r in reloads), "samples": samples,
    }


def plot_soak(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4))
    samples = result.get("samples", [])
    ts = [s["t"] / 60 for s in samples]
    ax1.plot(ts, [(s["rss_bytes"] or 0) / 2**20 for s in samples], label="server RSS")
    ax1.set_ylabel("MiB")
    for key, color, label in (("open_fds", "tab:purple", "all"), ("open_sockets", "tab:blue", "sockets"),
                              ("open_other_fds", "tab:green", "files, pipes, ..."),
                              ("in_flight", "tab:gray", "requests in flight")):
        ax2.plot(ts, [s[key] or 0 for s in samples], color=color, label=label)
    ax2.legend(fontsize=7)
    ax2.set_ylabel("open file descriptors of the server")
    w = result.get("p99_windows", [])
    ax3.plot([x["t"] / 60 for x in w], [x["p99_ms"] for x in w], "o-", label="p99")
    ax3.plot([x["t"] / 60 for x in w], [x["p50_ms"] for x in w], "s--", label="p50")
    ax3.set_ylabel("latency of the 200s, ms")
    ax3.legend(fontsize=8)
    for ax in (ax1, ax2, ax3):
        for r in result.get("reloads", []):
            ax.axvline(r["t"] / 60, color="k", alpha=0.2, linewidth=0.8)
        ax.set_xlabel("minutes (vertical lines: reloads)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"soak of linearrag serve on {Path(result['index']).name}: {result['soak_s']} s at "
                 f"{result['load_share']:.0%} of {result.get('capacity_qps')} q/s; failed {result.get('failed')}; "
                 f"RSS slope {(result.get('rss_slope_bytes_per_min') or 0) / 2**20:.2f} MiB/min, fds slope "
                 f"{result.get('open_fds_slope_per_min') or 0:.2f}/min (non-socket "
                 f"{result.get('open_other_fds_slope_per_min') or 0:.2f}/min)", fontsize=9)
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
    ap.add_argument("--overload", action="store_true",
                    help="overload mode: capacity at --max-concurrent clients, then --overload-factors times more "
                         "clients, aggressive (10 ms after a refusal) and well-behaved (SearchClient's backoff), "
                         "then recovery; goodput against capacity")
    ap.add_argument("--soak", type=float, metavar="SECONDS",
                    help="soak mode: SECONDS of mixed request sizes at --soak-load of capacity with a reload every "
                         "--reload-every s; failures, RSS and open-fd slopes, p99 drift")
    ap.add_argument("--max-concurrent", type=int, default=16,
                    help="the server's --max-concurrent in --overload and --soak (default %(default)s)")
    ap.add_argument("--overload-factors", type=int, nargs="+", default=[4, 16],
                    help="--overload: client counts as multiples of --max-concurrent (default %(default)s)")
    ap.add_argument("--client-nice", type=int, default=0, metavar="N",
                    help="run the client processes at nice N (e.g. 10): on a machine whose cores the clients share "
                         "with the server, an approximation of clients on other machines; report it beside a run "
                         "at 0 (default %(default)s)")
    ap.add_argument("--soak-max-concurrent", type=int, default=None, metavar="N",
                    help="--soak: the server's --max-concurrent (default: the server's own, 256; capacity is measured "
                         "with --max-concurrent clients either way). A soak is open-loop traffic at a share of capacity, "
                         "not overload: with a count limit near the mean number in flight its bursts are refused by "
                         "design")
    ap.add_argument("--soak-load", type=float, default=0.7, help="--soak: share of capacity (default %(default)s)")
    ap.add_argument("--soak-capacity-s", type=float, default=20.0,
                    help="--soak: seconds of the capacity measurement (default %(default)s)")
    ap.add_argument("--reload-every", type=float, default=120.0, help="--soak: seconds between reloads (default %(default)s)")
    ap.add_argument("--sample-every", type=float, default=5.0,
                    help="--soak: seconds between samples of RSS and open files (default %(default)s)")
    args = ap.parse_args(argv)
    if args.overload or args.soak is not None:
        if args.overload and args.soak is not None:
            ap.error("give --overload or --soak, not both")
        if args.soak is not None and not 0 < args.soak <= 24 * 3600:
            ap.error("--soak SECONDS must be in (0, 86400]")
        if not 0 < args.soak_load <= 1 or args.max_concurrent < 1 or min(args.overload_factors) < 1:
            ap.error("--soak-load must be in (0, 1], --max-concurrent and --overload-factors >= 1")
        questions = [q["question"] for q in read_questions(args.questions)][:args.limit or None]
        result = run_overload(args, questions) if args.overload else run_soak(args, questions)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        (plot_overload if args.overload else plot_soak)(result, args.png or args.json.with_suffix(".png"))
        summary = ({"capacity_qps": result.get("capacity_qps"), "all_targets_met": result.get("all_targets_met"),
                    "phases": {r["phase"]: [r.get("goodput_share"), r["p99_ms"], r["statuses"]]
                               for r in result.get("phases", [])}} if args.overload else
                   {k: result.get(k) for k in ("capacity_qps", "requests", "failed", "statuses", "reloads_ok",
                                               "rss_slope_bytes_per_min", "rss_slope_second_half_bytes_per_min",
                                               "open_fds_slope_per_min", "open_other_fds_slope_per_min", "fds_after_clients_closed", "p99_drift")})
        print(json.dumps(summary), file=sys.stderr)
        return 0
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
