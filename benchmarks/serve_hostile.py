"""`linearrag serve` against hostile and heavy clients (issue 39, sections 2 and 3), one server per mode, each
phase bounded in time, everything on 127.0.0.1.

    python -m benchmarks.serve_hostile --slow-clients --index DIR --questions FILE --json OUT [--png OUT]
        [--file-limit 4096] [--slow 6000] [--clients 8] [--duration 20] [--header-timeout 5]
    python -m benchmarks.serve_hostile --heavy-mix --index DIR --questions FILE --json OUT [--png OUT]
        [--max-concurrent 16] [--factor 4] [--heavy-share-of-clients 0.2] [--duration 20] [--rerank]
        [--heavy-questions N] [--heavy-top-k K] [--no-heavy-chars] [--aggressive]

--slow-clients: the server runs with its open-file limit (RLIMIT_NOFILE) set to --file-limit. Capacity with
--clients well-behaved closed-loop clients (one question each, the Retry-After honoured), then the same clients
beside --slow connections (more than the file limit, opened at 1,000 a second), each of which sends part of a
request head and then one byte every 2 s (with --reconnect, once the server closes it, opens a new one a second
later: a sustained flood), in a client process of its own. Reported:
goodput (200s / s) against the capacity of the same run (target >= 70%), the seconds from a slow connection's
opening to its closing by the server against --header-timeout (target: within it, up to the SLACK_S a loaded
2-core machine adds), connections refused at the cap, and the server's open files and RSS before, at the peak, and
once the slow connections are gone (target: back to their start).

--heavy-mix: light-only capacity (--max-concurrent clients sending one question at top_k 5), then --factor times
as many clients, --heavy-share-of-clients of them heavy: --max-questions questions of --max-question-chars
characters each (the server's limits) at top_k --max-top-k, with rerank when --rerank (the cross-encoder on a CPU
without AVX-512 makes a heavy request of 16 reranked long questions take tens of seconds: off by default).
Clients honour Retry-After. Reported: light goodput against the light-only capacity (target >= 70%), the heavy
requests answered, their share of the answered work units and of the engine's seconds during the mix (the server's
linearrag_engine_class_seconds_total; the units are a model of the cost, a reranked question's far above its
seconds), light p99 (target <= 2 s).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import multiprocessing
import random
import resource
import shlex
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import aiohttp
import torch

from benchmarks.common import machine
from benchmarks.serve import Server, closed_loop, percentiles
from linearrag_torch.corpus import read_questions
from linearrag_torch.serve.admission import request_cost

SLACK_S = 1.5  # a closing may come this long after its deadline on a loaded 2-core machine
DRIBBLE_S = 2.0  # a slow connection sends one byte this often
TARGETS = {"goodput_share": 0.70, "light_p99_ms": 2000.0}


def start_server(args, extra: list, file_limit: int | None = None) -> Server:
    """`linearrag serve` on 127.0.0.1 (benchmarks.serve.Server), with its RLIMIT_NOFILE at ``file_limit``: the
    child inherits this process's soft limit, set for the start and put back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if file_limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (file_limit, hard))
    try:
        server = Server(args.index, args.device, args.max_batch_size, 0.0, args.max_concurrent, args.timeout,
                        args.server_log, tuple(extra) + tuple(shlex.split(args.server_args)))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    server.wait_ready()
    return server


def sampled(server: Server, samples: list, stop: threading.Event, every: float = 1.0) -> threading.Thread:
    """A thread appending (seconds, open fds, sockets, RSS) of the server every ``every`` s until ``stop``."""
    t0 = time.perf_counter()

    def run():
        while not stop.is_set():
            fds = server.fd_kinds()
            samples.append((round(time.perf_counter() - t0, 2), fds["open_fds"], fds["open_sockets"],
                            server.memory()["rss_bytes"]))
            stop.wait(every)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def state(server: Server) -> dict:
    return {**server.fd_kinds(), "rss_bytes": server.memory()["rss_bytes"]}


# ------------------------------------------------------------------------------------------ slow connections
async def slow_flood(port: int, n: int, duration: float, reconnect: bool = False) -> dict:
    """``n`` slow connections for ``duration`` s: each sends a partial head and a byte every DRIBBLE_S s until the
    server closes it (with ``reconnect``, then a new one a second later). Per connection: refused at the cap or
    evicted (503), or closed after how many seconds; the ages of those still open at the end."""
    deadline = time.perf_counter() + duration
    closed_after, open_at_end, statuses, errors = [], [], Counter(), Counter()

    async def one(i: int):
        await asyncio.sleep(i * 0.001)  # 1,000 openings a second
        while time.perf_counter() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError as exc:
                errors[type(exc).__name__] += 1
                await asyncio.sleep(1.0)
                continue
            t0 = time.perf_counter()
            got = b""
            try:
                writer.write(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                while True:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        open_at_end.append(time.perf_counter() - t0)
                        break
                    try:
                        chunk = await asyncio.wait_for(reader.read(1024), min(DRIBBLE_S, left))
                    except asyncio.TimeoutError:
                        writer.write(b"a")
                        continue
                    if not chunk:
                        closed_after.append(time.perf_counter() - t0)
                        statuses[got[9:12].decode() or "none"] += 1
                        break
                    got += chunk
            except OSError:  # reset by the server
                closed_after.append(time.perf_counter() - t0)
                statuses["reset"] += 1
            finally:
                writer.close()
            if not reconnect:
                return
            await asyncio.sleep(1.0)

    await asyncio.gather(*(one(i) for i in range(n)))
    return {"closed_after_s": closed_after, "statuses": dict(statuses), "connect_errors": dict(errors),
            "open_at_end_ages_s": open_at_end}


def _flood_process(job):
    port, n, duration, reconnect = job
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return asyncio.run(slow_flood(port, n, duration, reconnect))


def run_slow_clients(args, questions: list[str]) -> dict:
    extra = ["--header-timeout", str(args.header_timeout), "--log-level", "error"]
    server = start_server(args, extra, args.file_limit)
    result = {"mode": "slow-clients", "file_limit": args.file_limit, "slow_connections": args.slow,
              "clients": args.clients, "header_timeout_s": args.header_timeout, "dribble_every_s": DRIBBLE_S,
              "reconnect": args.reconnect}
    try:
        asyncio.run(closed_loop(server.url, questions, 4, 2.0, 50, args.timeout))  # warm-up
        result["before"] = state(server)
        cap = asyncio.run(closed_loop(server.url, questions, args.clients, args.duration, 10**6, args.timeout))
        print(f"[slow] capacity {cap['throughput_qps']} q/s {cap['statuses']}", file=sys.stderr, flush=True)
        samples, stop = [], threading.Event()
        sampler = sampled(server, samples, stop)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            flood = pool.apply_async(_flood_process, ((server.port, args.slow, args.duration + 3.0, args.reconnect),))
            time.sleep(3.0)  # the flood's openings (1,000 a second) reach the cap first
            hostile = asyncio.run(closed_loop(server.url, questions, args.clients, args.duration, 10**6, args.timeout))
            slow = flood.get(args.duration + 120)
        print(f"[slow] beside {args.slow} slow connections {hostile['throughput_qps']} q/s {hostile['statuses']}",
              file=sys.stderr, flush=True)
        t0 = time.perf_counter()  # the slow connections are gone: the server's files and memory back?
        while time.perf_counter() - t0 < args.header_timeout + 10 and \
                (server.fd_kinds()["open_sockets"] or 0) > result["before"]["open_sockets"]:
            time.sleep(0.5)
        time.sleep(2.0)
        stop.set()
        sampler.join()
        result["after"] = state(server)
        result["metrics"] = {line.split(" ")[0]: float(line.split(" ")[1]) for line in
                             aiohttp_get(server.url + "/metrics").splitlines()
                             if line.startswith(("linearrag_connections_closed_total", "linearrag_open_connections"))}
    finally:
        result["exit_code"] = server.stop()
    closes = sorted(slow["closed_after_s"])
    by_timeout = [c for c in closes if c > 0.5]  # (a refusal at the cap closes at once)
    overdue = [a for a in slow["open_at_end_ages_s"] if a > args.header_timeout + SLACK_S]
    share = hostile["throughput_qps"] / cap["throughput_qps"] if cap["throughput_qps"] else None
    result.update(
        capacity=cap, beside_slow=hostile,
        slow=dict(slow, closed_after_s=None, open_at_end_ages_s=None, open_at_end=len(slow["open_at_end_ages_s"]),
                  overdue_at_end=len(overdue)),
        goodput_share=round(share, 3) if share is not None else None,
        slow_closed=len(closes), slow_closed_at_once=len(closes) - len(by_timeout),
        slow_close_s={"p50": pct(by_timeout, 50), "p99": pct(by_timeout, 99), "max": pct(by_timeout, 100)},
        peak={"open_fds": max((s[1] or 0) for s in samples), "open_sockets": max((s[2] or 0) for s in samples),
              "rss_bytes": max((s[3] or 0) for s in samples)},
        samples=samples)
    b, a = result["before"], result["after"]
    result["checks"] = {
        "goodput": share is not None and share >= TARGETS["goodput_share"],
        "closed_within_timeout": bool(by_timeout) and by_timeout[-1] <= args.header_timeout + SLACK_S,
        "none_open_past_the_timeout": not overdue,
        "more_attempted_than_the_file_limit": args.slow > args.file_limit,
        "open_fds_back": a["open_fds"] <= b["open_fds"],
        "rss_back_within_10pct": a["rss_bytes"] <= 1.10 * b["rss_bytes"]}
    result["targets_met"] = all(result["checks"].values())
    return result


def pct(xs: list, p: float):
    if not xs:
        return None
    return round(xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 3)


def class_seconds(url: str) -> dict:
    """The server's engine seconds so far by request class (linearrag_engine_class_seconds_total)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"light": 0.0, "heavy": 0.0}
    for family in text_string_to_metric_families(aiohttp_get(url + "/metrics")):
        if family.name == "linearrag_engine_class_seconds":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["class"]] = sample.value
    return out


def aiohttp_get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=30).text


# ------------------------------------------------------------------------------------------ heavy mix
def long_question(questions: list[str], i: int, chars: int) -> str:
    text, j = questions[i % len(questions)], i + 1
    while len(text) < chars:
        text += " " + questions[j % len(questions)]
        j += 1
    return text[:chars]


async def mix(url: str, light_qs: list[str], heavy_body, light: int, heavy: int, duration: float,
              timeout: float, aggressive: bool = False) -> dict:
    """``light`` + ``heavy`` closed-loop clients for ``duration`` s, the Retry-After of a 429 / 503 honoured (with
    ``aggressive``: ignored, the next request 10 ms after the refusal, as issue 47's clients). Each
    class's rates are over its own clients' time, until the last of them has its last answer (a heavy request still
    in flight at the end kept the light rate's clock running for seconds after the light clients stopped)."""
    deadline = time.perf_counter() + duration
    rows = {k: {"latencies": [], "statuses": Counter(), "questions": 0, "units": 0.0, "end": 0.0}
            for k in ("light", "heavy")}

    async def client(kind: str, i: int, http):
        rng = random.Random(i)
        row = rows[kind]
        while time.perf_counter() < deadline:
            body = {"question": rng.choice(light_qs), "top_k": 5} if kind == "light" else heavy_body(rng)
            t0 = time.perf_counter()
            try:
                async with http.post(url + "/v1/search", json=body) as r:
                    await r.read()
                row["statuses"][str(r.status)] += 1
                if r.status == 200:
                    row["latencies"].append(time.perf_counter() - t0)
                    qs = body.get("questions") or [body["question"]]
                    row["questions"] += len(qs)
                    row["units"] += request_cost(qs, body["top_k"], bool(body.get("rerank")))
                elif r.status in (429, 503):
                    wait = 0.01 if aggressive else float(r.headers.get("Retry-After", "1"))
                    await asyncio.sleep(min(wait, max(0.0, deadline - time.perf_counter())))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                row["statuses"][type(exc).__name__] += 1
                await asyncio.sleep(0.05)
        row["end"] = max(row["end"], time.perf_counter())

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=light + heavy),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        await asyncio.gather(*(client("light", i, http) for i in range(light)),
                             *(client("heavy", 10_000 + i, http) for i in range(heavy)))
    wall = time.perf_counter() - t0
    out = {}
    for kind, row in rows.items():
        n, seconds = len(row["latencies"]), max(row["end"] - t0, 1e-9)
        out[kind] = {"clients": light if kind == "light" else heavy, "ok": n, "statuses": dict(row["statuses"]),
                     "seconds": round(seconds, 2), "ok_per_s": round(n / seconds, 2), "questions": row["questions"],
                     "units": round(row["units"], 1), "units_per_s": round(row["units"] / seconds, 2),
                     **percentiles(row["latencies"])}
    out["seconds"] = round(wall, 2)
    return out


def run_heavy_mix(args, questions: list[str]) -> dict:
    extra = ["--max-questions", str(args.max_questions), "--max-question-chars", str(args.max_question_chars),
             "--max-top-k", str(args.max_top_k), "--log-level", "error"]
    server = start_server(args, extra)
    m = args.max_concurrent
    heavy_n = round(args.factor * m * args.heavy_share_of_clients)
    light_n = args.factor * m - heavy_n
    longs = [long_question(questions, i, args.max_question_chars) for i in range(200)]

    heavy_qs = longs if args.heavy_chars else questions
    heavy_n_questions = args.heavy_questions or args.max_questions
    heavy_top_k = args.heavy_top_k or args.max_top_k

    def heavy_body(rng):
        body = {"questions": rng.sample(heavy_qs, heavy_n_questions), "top_k": heavy_top_k}
        if args.rerank:
            body["rerank"] = True
        return body

    example = heavy_body(random.Random(0))
    result = {"mode": "heavy-mix", "max_concurrent": m, "factor": args.factor, "light_clients": light_n,
              "heavy_clients": heavy_n, "heavy_request": {
                  "questions": heavy_n_questions, "chars": args.max_question_chars if args.heavy_chars else None,
                  "top_k": heavy_top_k, "rerank": args.rerank,
                  "cost_units": round(request_cost(example["questions"], heavy_top_k, args.rerank), 1)},
              "aggressive_clients": args.aggressive,
              "light_request": {"questions": 1, "top_k": 5, "cost_units": 1.0}}
    try:
        asyncio.run(closed_loop(server.url, questions, 4, 2.0, 50, args.timeout))  # warm-up
        alone = asyncio.run(mix(server.url, questions, heavy_body, m, 0, args.duration, args.timeout))  # capacity
        print(f"[mix] light alone: {alone['light']['ok_per_s']} /s p99 {alone['light']['p99_ms']} ms",
              file=sys.stderr, flush=True)
        before = class_seconds(server.url)
        both = asyncio.run(mix(server.url, questions, heavy_body, light_n, heavy_n, args.duration, args.timeout,
                               args.aggressive))
        after = class_seconds(server.url)
        engine_s = {c: round(after[c] - before[c], 2) for c in after}
        print(f"[mix] {light_n} light + {heavy_n} heavy: light {both['light']['ok_per_s']} /s p99 "
              f"{both['light']['p99_ms']} ms {both['light']['statuses']}; heavy {both['heavy']['ok']} answered "
              f"p50 {both['heavy']['p50_ms']} ms {both['heavy']['statuses']}; engine seconds {engine_s}",
              file=sys.stderr, flush=True)
        info = json.loads(aiohttp_get(server.url + "/info"))
        result["server_admission"] = info.get("admission")
    finally:
        result["exit_code"] = server.stop()
    cap = alone["light"]["ok_per_s"]
    share = round(both["light"]["ok_per_s"] / cap, 3) if cap else None
    units = both["light"]["units"] + both["heavy"]["units"]
    result.update(light_alone=alone["light"], mix=both, light_goodput_share=share,
                  heavy_share_of_work=round(both["heavy"]["units"] / units, 3) if units else None,
                  mix_engine_seconds=engine_s, heavy_share_of_engine_seconds=round(
                      engine_s["heavy"] / sum(engine_s.values()), 3) if sum(engine_s.values()) else None)
    result["checks"] = {"light_goodput": share is not None and share >= TARGETS["goodput_share"],
                        "light_p99": both["light"]["p99_ms"] is not None
                        and both["light"]["p99_ms"] <= TARGETS["light_p99_ms"],
                        "heavy_served": both["heavy"]["ok"] > 0,
                        "statuses": set(both["light"]["statuses"]) | set(both["heavy"]["statuses"])
                        <= {"200", "429", "503"}}
    result["targets_met"] = all(result["checks"].values())
    return result


# ------------------------------------------------------------------------------------------ plots, main
def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
    if result["mode"] == "slow-clients":
        cap, hostile = result["capacity"], result["beside_slow"]
        ax1.bar(["capacity", f"beside {result['slow_connections']} slow"],
                [cap["throughput_qps"] or 0, hostile["throughput_qps"] or 0], color=["tab:gray", "tab:blue"])
        ax1.axhline(TARGETS["goodput_share"] * (cap["throughput_qps"] or 0), color="k", linestyle="--",
                    linewidth=0.8, label="70% of capacity")
        ax1.set_ylabel("goodput (200s / s)")
        ax1.legend(fontsize=7)
        ts = [s[0] for s in result["samples"]]
        ax2.plot(ts, [s[1] or 0 for s in result["samples"]], label="server open fds")
        ax2.axhline(result["file_limit"], color="r", linestyle=":", linewidth=0.8, label="RLIMIT_NOFILE")
        ax2.set_xlabel("seconds since the flood began")
        ax2.set_ylabel("open files")
        ax3 = ax2.twinx()
        ax3.plot(ts, [(s[3] or 0) / 2**20 for s in result["samples"]], color="tab:orange", label="RSS, MiB")
        ax3.set_ylabel("RSS, MiB")
        ax2.legend(fontsize=7, loc="upper right")
        title = (f"slow connections: goodput {result['goodput_share']:.0%} of capacity; closed after <= "
                 f"{result['slow_close_s']['max']} s (header timeout {result['header_timeout_s']} s)")
    else:
        mix_, alone = result["mix"], result["light_alone"]
        ax1.bar(["light alone", "light in mix", "heavy in mix"],
                [alone["ok_per_s"], mix_["light"]["ok_per_s"], mix_["heavy"]["ok_per_s"]],
                color=["tab:gray", "tab:blue", "tab:red"])
        ax1.axhline(TARGETS["goodput_share"] * alone["ok_per_s"], color="k", linestyle="--", linewidth=0.8,
                    label="70% of light capacity")
        ax1.set_ylabel("requests answered / s")
        ax1.legend(fontsize=7)
        names = ["light alone", "light in mix", "heavy in mix"]
        rows = [alone, mix_["light"], mix_["heavy"]]
        ax2.bar([n + " p50" for n in names], [r["p50_ms"] or 0 for r in rows], color="tab:green")
        ax2.bar([n + " p99" for n in names], [r["p99_ms"] or 0 for r in rows], color="tab:orange")
        ax2.axhline(TARGETS["light_p99_ms"], color="k", linestyle="--", linewidth=0.8)
        ax2.set_yscale("log")
        ax2.set_ylabel("latency of the 200s, ms")
        ax2.tick_params(axis="x", labelrotation=30, labelsize=7)
        title = (f"heavy mix at {result['factor']}x: light goodput {result['light_goodput_share']:.0%} of light "
                 f"capacity, light p99 {mix_['light']['p99_ms']} ms; heavy {mix_['heavy']['ok']} answered, "
                 f"{result.get('heavy_share_of_engine_seconds') or 0:.0%} of the engine's seconds")
    fig.suptitle(f"{title} ({result['machine']['cpu_count']} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_hostile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--slow-clients", action="store_true", help="slow connections beyond the open-file limit")
    mode.add_argument("--heavy-mix", action="store_true", help="light and heavy requests at --factor x overload")
    ap.add_argument("--index", required=True, type=Path)
    ap.add_argument("--questions", required=True, type=Path, help='JSON lines with "question"')
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--png", type=Path, help="default: next to --json")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per phase (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=30.0, help="server and client timeout (default %(default)s)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-concurrent", type=int, default=16, help="the server's (default %(default)s)")
    ap.add_argument("--max-batch-size", type=int, default=64, help="the server's (default %(default)s)")
    ap.add_argument("--server-args", default="", help="more `linearrag serve` flags")
    ap.add_argument("--server-log", type=Path)
    ap.add_argument("--note", default="", help="a line for the JSON (e.g. what else ran on the machine)")
    ap.add_argument("--file-limit", type=int, default=4096, help="--slow-clients: the server's RLIMIT_NOFILE")
    ap.add_argument("--slow", type=int, default=6000, help="--slow-clients: slow connections (default %(default)s)")
    ap.add_argument("--clients", type=int, default=8, help="--slow-clients: well-behaved clients")
    ap.add_argument("--header-timeout", type=float, default=5.0, help="--slow-clients: the server's")
    ap.add_argument("--reconnect", action="store_true",
                    help="--slow-clients: a slow connection closed by the server opens again a second later (a "
                         "sustained flood; default: each of --slow is attempted once)")
    ap.add_argument("--factor", type=int, default=4, help="--heavy-mix: clients as a multiple of --max-concurrent")
    ap.add_argument("--heavy-share-of-clients", type=float, default=0.2)
    ap.add_argument("--max-questions", type=int, default=16, help="--heavy-mix: the server's limit, a heavy batch")
    ap.add_argument("--max-question-chars", type=int, default=1000, help="--heavy-mix: the server's limit")
    ap.add_argument("--max-top-k", type=int, default=100, help="--heavy-mix: the server's limit")
    ap.add_argument("--rerank", action="store_true", help="--heavy-mix: heavy requests rerank")
    ap.add_argument("--heavy-questions", type=int, default=0,
                    help="--heavy-mix: questions in a heavy request (default: --max-questions)")
    ap.add_argument("--heavy-top-k", type=int, default=0, help="--heavy-mix: a heavy request's top_k (default: --max-top-k)")
    ap.add_argument("--heavy-chars", action=argparse.BooleanOptionalAction, default=True,
                    help="--heavy-mix: heavy questions of --max-question-chars characters (--no-heavy-chars: the "
                         "data's own questions)")
    ap.add_argument("--aggressive", action="store_true",
                    help="--heavy-mix: the mix's clients ignore Retry-After and send again 10 ms after a 429 / 503 "
                         "(issue 47's clients); the light-only capacity is measured with well-behaved ones")
    args = ap.parse_args(argv)
    questions = [q["question"] for q in read_questions(args.questions)]
    head = {"date": _dt.date.today().isoformat(), "index": str(args.index), "questions": str(args.questions),
            "duration_s": args.duration, "server_args": args.server_args, "note": args.note,
            "client": f"aiohttp {aiohttp.__version__}", "targets": TARGETS,
            "machine": machine(torch.device(args.device), torch.get_num_threads())}
    result = {**head, **(run_slow_clients(args, questions) if args.slow_clients else run_heavy_mix(args, questions))}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    plot(result, args.png or args.json.with_suffix(".png"))
    print(json.dumps({k: result.get(k) for k in ("goodput_share", "slow_close_s", "light_goodput_share",
                                                  "heavy_share_of_work", "heavy_share_of_engine_seconds", "checks",
                                                  "targets_met")}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
