"""The server as a store (issue 51): memory of several indexes in one process, ingest over HTTP under search load,
SIGKILL during the ingest, and one index's throughput while another is overloaded. Each mode starts real
`linearrag serve` processes on 127.0.0.1.

    python -m benchmarks.store memory --indexes A_DIR B_DIR [--questions Q.jsonl]
    python -m benchmarks.store ingest --index BASE_DIR --more MORE.jsonl --questions Q.jsonl --full FULL_DIR
        [--batch 10] [--clients 32]
    python -m benchmarks.store kill --index BASE_DIR --more MORE.jsonl [--trials 20] [--seed 0]
    python -m benchmarks.store fairness --indexes A_DIR B_DIR --questions Q.jsonl [--seconds 30] [--clients 8]
    (each with [--out benchmarks/results/store_MODE_DATE.json])
    python -m benchmarks.store plot-fairness OUT.png FAIRNESS.json...   (the fairness runs side by side)

memory: RSS of a server of A alone, of B alone, and of one server of both (after a few searches on each, so that
each index's device graph is built); the target: both <= 1.2 x (the larger alone + the smaller's tensors).

ingest: BASE_DIR (copied) served as a store; MORE.jsonl added over HTTP in batches of --batch while --clients
clients search the questions without pause. Every search must answer 200; at the end every added passage is
present, the folder loads verified, and it equals FULL_DIR (a fresh build of BASE + MORE) on the questions:
benchmarks.compare_indexes (top-5 identical in both retrieval modes). Each write's seconds against the index's size
(the incremental add's cost per passage) go to the JSON and a plot.

kill: --trials times: a store server on a copy of BASE_DIR (the copy carried from trial to trial), writes of
--batch passages of MORE.jsonl one after the other, SIGKILL at a seeded random moment; then the folder must load
verified, hold every write acknowledged before the kill (and each write whole or not at all), and take the next
trial's writes (the lock free).

fairness: A and B served by one store. A's throughput alone with --clients closed-loop clients (each sends its next
question when answered), then the same while B receives 4x the questions per second it answers alone (open loop,
each request one question; refusals and all). Also A as an open-loop load at half its alone throughput, alone and
beside B's overload. The target: A keeps >= 70% of its alone throughput. Each phase also records each index's
engine seconds (share of the phase) and mean batch, from /metrics. The loads are sent by RawPost (bare asyncio
streams, keep-alive), so that the load generator takes little of the cores the server shares with it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .common import log

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `linearrag serve PATH... --store` process on 127.0.0.1."""

    def __init__(self, paths, *flags, log_path=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log = open(log_path or os.devnull, "ab")  # noqa: SIM115 (the server's log, open while it runs; stop closes it)
        self.proc = subprocess.Popen([sys.executable, "-m", "linearrag_torch.cli", "serve", *map(str, paths), "--store",
                                      "--port", str(self.port), "--log-level", "warning", "--no-mcp", *flags],
                                     env=env, stdout=self.log, stderr=self.log, cwd=ROOT)

    def wait(self, seconds=600.0):
        import httpx

        deadline = time.monotonic() + seconds
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise RuntimeError("the server did not become ready")
            time.sleep(0.2)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def read_jsonl(path) -> list:
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]


def questions_of(path, n=None) -> list:
    qs = [q["question"] for q in read_jsonl(path)]
    return qs[:n] if n else qs


def search_some(url, name, questions, n=8):
    import httpx

    for q in questions[:n]:
        r = httpx.post(f"{url}/v1/indexes/{name}/search", json={"question": q}, timeout=120)
        r.raise_for_status()


def rss_of(url) -> int:
    import httpx

    return httpx.get(url + "/info", timeout=30).json()


# ---------------------------------------------------------------------------------------------- memory
def run_memory(args) -> dict:
    questions = questions_of(args.questions, 16) if args.questions else ["Who directed the film?"] * 8
    out = {"indexes": [str(p) for p in args.indexes], "alone": {}}
    for path in args.indexes:
        srv = Server([path]).wait()
        try:
            name = Path(path).resolve().name
            search_some(srv.url, name, questions)
            info = rss_of(srv.url)
            idx = info["indexes"][name]
            out["alone"][name] = {"rss_bytes": idx["memory"]["rss_bytes"],
                                  "index_tensors_bytes": idx["memory"]["index_tensors_bytes"],
                                  "passages": idx["index"]["passages"]}
            log(f"{name} alone: RSS {idx['memory']['rss_bytes'] / 2**20:.0f} MiB, tensors "
                f"{idx['memory']['index_tensors_bytes'] / 2**20:.0f} MiB")
        finally:
            srv.stop()
    srv = Server(args.indexes, log_path=args.server_log).wait()
    try:
        for path in args.indexes:
            search_some(srv.url, Path(path).resolve().name, questions)
        info = rss_of(srv.url)
        rss = next(iter(info["indexes"].values()))["memory"]["rss_bytes"]
        import httpx

        # unloading the smaller index gives its memory back
        smaller = min(out["alone"], key=lambda n: out["alone"][n]["rss_bytes"])
        httpx.post(f"{srv.url}/v1/indexes/{smaller}/unload", timeout=120).raise_for_status()
        time.sleep(1.0)
        info = rss_of(srv.url)
        out["after_unload"] = {"unloaded": smaller,
                               "rss_bytes": next(iter(info["indexes"].values()))["memory"]["rss_bytes"]}
    finally:
        srv.stop()
    alone = out["alone"]
    larger = max(alone, key=lambda n: alone[n]["rss_bytes"])
    smaller_tensors = sum(v["index_tensors_bytes"] for n, v in alone.items() if n != larger)
    bound = alone[larger]["rss_bytes"] + smaller_tensors
    out.update({"together_rss_bytes": rss, "larger": larger, "bound_bytes": bound, "ratio": rss / bound,
                "separate_processes_rss_bytes": sum(v["rss_bytes"] for v in alone.values()),
                "target_met": rss <= 1.2 * bound})
    log(f"after unloading {out['after_unload']['unloaded']}: RSS {out['after_unload']['rss_bytes'] / 2**20:.0f} MiB")
    log(f"together: RSS {rss / 2**20:.0f} MiB = {rss / bound:.3f} x (larger alone + the other's tensors) "
        f"[{'met' if out['target_met'] else 'NOT met'}: <= 1.2]; two processes would hold "
        f"{out['separate_processes_rss_bytes'] / 2**20:.0f} MiB")
    return out


# ---------------------------------------------------------------------------------------------- ingest
async def _searchers(url, name, questions, clients, stop: asyncio.Event, record: dict):
    import httpx

    async def one(i):
        async with httpx.AsyncClient(timeout=120) as c:
            k = i
            while not stop.is_set():
                q = questions[k % len(questions)]
                k += clients
                try:
                    r = await c.post(f"{url}/v1/indexes/{name}/search", json={"question": q})
                    record["statuses"][r.status_code] = record["statuses"].get(r.status_code, 0) + 1
                except httpx.HTTPError as exc:
                    record["errors"].append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(one(i) for i in range(clients)))


async def _ingest(url, name, more, batch, record):
    import httpx

    async with httpx.AsyncClient(timeout=600) as c:
        for s in range(0, len(more), batch):
            t0 = time.perf_counter()
            r = await c.post(f"{url}/v1/indexes/{name}/passages", json={"passages": more[s:s + batch]})
            if r.status_code != 200:
                raise RuntimeError(f"write {s // batch} answered {r.status_code}: {r.text[:300]}")
            body = r.json()
            record["writes"].append({"passages_before": body["before"]["passages"], "added": body["passages"],
                                     "server_seconds": body["seconds"], "client_seconds": time.perf_counter() - t0})
            if len(record["writes"]) % 10 == 0:
                log(f"{len(record['writes'])} writes, index at {body['counts']['passages']} passages, last "
                    f"{body['seconds']:.2f} s")


def run_ingest(args) -> dict:
    from benchmarks.compare_indexes import compare
    from linearrag_torch.corpus import read_questions
    from linearrag_torch.index import TriGraphIndex

    work = Path(tempfile.mkdtemp(prefix="store_ingest_"))
    folder = work / Path(args.index).resolve().name
    shutil.copytree(args.index, folder)
    name = folder.name
    more = read_jsonl(args.more)
    questions = questions_of(args.questions)
    srv = Server([folder], "--max-write-passages", str(max(64, args.batch))).wait()
    record = {"statuses": {}, "errors": [], "writes": []}
    try:
        async def main():
            stop = asyncio.Event()
            searching = asyncio.ensure_future(_searchers(srv.url, name, questions, args.clients, stop, record))
            await asyncio.sleep(2.0)
            t0 = time.perf_counter()
            try:
                await _ingest(srv.url, name, more, args.batch, record)
            finally:
                record["ingest_seconds"] = time.perf_counter() - t0
                await asyncio.sleep(1.0)
                stop.set()
                await searching

        asyncio.run(main())
    finally:
        srv.stop()
    index = TriGraphIndex.load(folder, verify=True)
    present = {str(p) for p in index.passage_ids}
    missing = [p["id"] for p in more if str(p["id"]) not in present]
    log(f"searches: {record['statuses']}, errors {len(record['errors'])}; missing after the ingest: {len(missing)}")
    cmp = compare(folder, args.full, [q["question"] for q in read_questions(args.questions)])
    same = {"ok": cmp["ok"], **{m: {"same_top_k_ids": cmp[m]["same_top_k_ids"], "questions": cmp[m]["questions"],
                                     "max_abs_score_diff": cmp[m]["max_abs_score_diff"]} for m in ("reference", "paper")},
            "strings_equal": cmp["strings_equal"], "matrices_equal": cmp["matrices_equal"],
            "emb_max_abs_diff": cmp["emb_max_abs_diff"]}
    log(f"against a fresh build: {json.dumps(same)}")
    out = {"index": str(args.index), "more": str(args.more), "batch": args.batch, "clients": args.clients,
           "searches": record["statuses"], "search_errors": record["errors"][:20],
           "failed_searches": sum(v for k, v in record["statuses"].items() if k != 200) + len(record["errors"]),
           "missing": missing, "ingest_seconds": record["ingest_seconds"], "writes": record["writes"],
           "compare": cmp, "summary": same}
    shutil.rmtree(work, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------- kill
def run_kill(args) -> dict:
    import httpx

    from linearrag_torch.index import TriGraphIndex, index_lock

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="store_kill_"))
    folder = work / Path(args.index).resolve().name
    shutil.copytree(args.index, folder)
    name = folder.name
    more = read_jsonl(args.more)
    batches = [more[s:s + args.batch] for s in range(0, len(more), args.batch)]
    acknowledged, trials, nxt = [], [], 0
    for trial in range(args.trials):
        if nxt >= len(batches):
            break
        srv = Server([folder], log_path=args.server_log).wait(args.start_timeout)
        delay = rng.uniform(args.min_delay, args.max_delay)
        sent, acked = [], []

        def writer(srv=srv, sent=sent, acked=acked):  # this trial's, even if a thread outlived its join
            nonlocal nxt
            with httpx.Client(timeout=600) as c:
                while nxt < len(batches):
                    b = batches[nxt]
                    sent.append(nxt)
                    try:
                        r = c.post(f"{srv.url}/v1/indexes/{name}/passages", json={"passages": b})
                    except httpx.HTTPError:
                        return
                    if r.status_code != 200:
                        return
                    acked.append(nxt)
                    nxt += 1

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        time.sleep(delay)
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        srv.log.close()
        t.join(60)
        acknowledged += acked
        result = {"trial": trial, "kill_after_s": round(delay, 3), "writes_acknowledged": len(acked),
                  "in_flight": [i for i in sent if i not in acked]}
        try:
            index = TriGraphIndex.load(folder, verify=True)
            present = {str(p) for p in index.passage_ids}
            result["loads_verified"] = True
            lost = [i for i in acknowledged if any(str(p["id"]) not in present for p in batches[i])]
            partial = [i for i in range(len(batches)) if 0 < sum(str(p["id"]) in present for p in batches[i])
                       < len(batches[i])]
            result.update({"acknowledged_lost": lost, "partial_writes": partial, "passages": index.num_passages})
            # a write in flight at the kill that did commit: its batch is there; count it as done for the next trial
            result["in_flight_committed"] = []  # killed between its commit and its answer: present, not acknowledged
            for i in result["in_flight"]:
                if all(str(p["id"]) in present for p in batches[i]):
                    result["in_flight_committed"].append(i)
                    nxt = max(nxt, i + 1)
            with index_lock(folder):  # the dead server's lock is free at once
                result["lock_free"] = True
        except Exception as exc:  # noqa: BLE001 (a damaged index: the failure this measures)
            result.update({"loads_verified": False, "error": f"{type(exc).__name__}: {exc}"})
        trials.append(result)
        log(f"trial {trial}: killed after {delay:.2f} s, {len(acked)} acknowledged, in flight {result['in_flight']}, "
            f"verified {result.get('loads_verified')}, lost {result.get('acknowledged_lost')}")
    ok = all(t.get("loads_verified") and not t.get("acknowledged_lost") and not t.get("partial_writes")
             and t.get("lock_free") for t in trials)
    shutil.rmtree(work, ignore_errors=True)
    committed = sum(len(t.get("in_flight_committed", [])) for t in trials)
    log(f"{len(trials)} trials, {len(acknowledged)} writes acknowledged, {committed} committed but killed before "
        f"their answer; all verified, none lost, none partial, lock free: {ok}")
    return {"index": str(args.index), "trials": trials, "acknowledged_writes": len(acknowledged),
            "in_flight_committed": committed, "all_ok": ok}


# ---------------------------------------------------------------------------------------------- fairness
class RawPost:
    """POSTs of prepared JSON bodies over a pool of keep-alive HTTP/1.1 connections on bare asyncio streams: the
    fairness loads send hundreds of requests a second from the server's own cores, and httpx's per-request work
    took a large share of them (the measure is the server's, not the load generator's). Returns the status, or the
    exception's name when the connection failed."""

    def __init__(self, url: str, path: str):
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.host, self.port, self.path = u.hostname, u.port, path
        self._idle: list = []

    def request_bytes(self, body: dict) -> bytes:
        data = json.dumps(body).encode()
        return (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode() + data

    async def post(self, raw: bytes, timeout: float = 120.0):
        conn = self._idle.pop() if self._idle else None
        while True:  # a pooled connection the server closed meanwhile (keep-alive timeout): again on a new one
            fresh = conn is None
            try:
                reader, writer = conn = conn or await asyncio.open_connection(self.host, self.port)
                writer.write(raw)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
                lines = head.decode("latin-1").split("\r\n")
                status = int(lines[0].split()[1])
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                await reader.readexactly(int(headers.get("content-length", "0")))
                if headers.get("connection", "").lower() == "close":
                    writer.close()
                else:
                    self._idle.append((reader, writer))
                return status
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as exc:
                if conn is not None:
                    conn[1].close()
                conn = None
                if fresh:
                    return type(exc).__name__

    def close(self) -> None:
        for _, w in self._idle:
            w.close()
        self._idle.clear()


async def _closed(url, name, questions, clients, seconds) -> dict:
    done, statuses = [0], {}
    end = time.perf_counter() + seconds
    client = RawPost(url, f"/v1/indexes/{name}/search")
    raws = [client.request_bytes({"question": q}) for q in questions]

    async def one(i):
        k = i
        while time.perf_counter() < end:
            status = await client.post(raws[k % len(raws)])
            k += clients
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                done[0] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    client.close()
    return {"answered": done[0], "seconds": time.perf_counter() - t0, "qps": done[0] / (time.perf_counter() - t0),
            "statuses": statuses}


async def _open(url, name, questions, rate, seconds) -> dict:
    """Requests of one question at ``rate`` a second, each on its own (not waiting for the others)."""
    statuses, done, tasks = {}, [0], []
    client = RawPost(url, f"/v1/indexes/{name}/search")
    raws = [client.request_bytes({"question": q}) for q in questions]

    async def one(raw):
        status = await client.post(raw)
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            done[0] += 1

    t0 = time.perf_counter()
    k = 0
    while time.perf_counter() - t0 < seconds:
        tasks.append(asyncio.ensure_future(one(raws[k % len(raws)])))
        k += 1
        await asyncio.sleep(max(0.0, t0 + k / rate - time.perf_counter()))
    sent_for = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    client.close()
    return {"sent": k, "answered": done[0], "seconds": sent_for, "qps": done[0] / sent_for, "statuses": statuses}


def engine_counters(url) -> dict:
    """{index: {"engine_s", "batches", "questions"}} from the server's /metrics (each index's engine seconds, engine
    calls and questions in them so far)."""
    import re

    import httpx

    out: dict = {}
    text = httpx.get(url + "/metrics", timeout=30).text
    for metric, field in (("linearrag_engine_seconds_sum", "engine_s"), ("linearrag_engine_seconds_count", "batches"),
                          ("linearrag_batch_size_questions_sum", "questions")):
        for name, value in re.findall(metric + r'\{index="([^"]+)"\} (\S+)', text):
            out.setdefault(name, {})[field] = float(value)
    return out


def engine_delta(before: dict, after: dict, seconds: float) -> dict:
    """Each index's engine seconds (and their share of the phase's wall seconds), batches and mean batch between
    two engine_counters."""
    out = {}
    for name, a in after.items():
        b = before.get(name, {})
        d = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in ("engine_s", "batches", "questions")}
        d["busy_share"] = d["engine_s"] / seconds if seconds else None
        d["mean_batch"] = d["questions"] / d["batches"] if d["batches"] else None
        out[name] = d
    return out


def run_fairness(args) -> dict:
    qs = questions_of(args.questions)
    a, b = (Path(p).resolve().name for p in args.indexes)
    srv = Server(args.indexes).wait()
    try:
        for name in (a, b):
            search_some(srv.url, name, qs)

        async def main():
            out, engine = {}, {}

            async def phase(label, *loads):
                before, t0 = await asyncio.to_thread(engine_counters, srv.url), time.perf_counter()
                got = await asyncio.gather(*loads)
                after = await asyncio.to_thread(engine_counters, srv.url)
                engine[label] = engine_delta(before, after, time.perf_counter() - t0)
                log(f"{label}: " + ", ".join(f"{n} engine {v['busy_share']:.0%} of the time, mean batch "
                                             f"{v['mean_batch'] or 0:.1f}" for n, v in engine[label].items()))
                return got

            out["a_alone_closed"], = await phase("a_alone_closed", _closed(srv.url, a, qs, args.clients, args.seconds))
            log(f"A alone, {args.clients} closed-loop clients: {out['a_alone_closed']['qps']:.1f} q/s")
            out["b_alone_closed"], = await phase("b_alone_closed",
                                                 _closed(srv.url, b, qs[::-1], args.clients, args.seconds))
            rate_b = 4 * out["b_alone_closed"]["qps"]
            log(f"B alone: {out['b_alone_closed']['qps']:.1f} q/s; B's overload: {rate_b:.1f} q/s offered")
            out["a_closed_beside_b_overload"], out["b_overload_beside_a_closed"] = await phase(
                "closed_beside_overload", _closed(srv.url, a, qs, args.clients, args.seconds),
                _open(srv.url, b, qs[::-1], rate_b, args.seconds))
            log(f"A closed beside B's overload: {out['a_closed_beside_b_overload']['qps']:.1f} q/s")
            rate_a = 0.5 * out["a_alone_closed"]["qps"]
            out["a_alone_open"], = await phase("a_alone_open", _open(srv.url, a, qs, rate_a, args.seconds))
            out["a_open_beside_b_overload"], out["b_overload_beside_a_open"] = await phase(
                "open_beside_overload", _open(srv.url, a, qs, rate_a, args.seconds),
                _open(srv.url, b, qs[::-1], rate_b, args.seconds))
            log(f"A open at {rate_a:.1f} q/s: alone {out['a_alone_open']['qps']:.1f} q/s, beside B's overload "
                f"{out['a_open_beside_b_overload']['qps']:.1f} q/s")
            out["engine"] = engine
            return out

        out = asyncio.run(main())
    finally:
        srv.stop()
    out["closed_kept"] = out["a_closed_beside_b_overload"]["qps"] / out["a_alone_closed"]["qps"]
    out["open_kept"] = out["a_open_beside_b_overload"]["qps"] / out["a_alone_open"]["qps"]
    log(f"A kept {100 * out['closed_kept']:.0f}% (closed loop, saturating) and {100 * out['open_kept']:.0f}% "
        f"(open loop at half its capacity) of its alone throughput beside B at 4x overload")
    return {"indexes": [str(p) for p in args.indexes], "clients": args.clients, "seconds": args.seconds, **out}


# ---------------------------------------------------------------------------------------------- main
def plot_ingest(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = out["writes"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([x["passages_before"] for x in w], [x["server_seconds"] / x["added"] * 1000 for x in w], ".")
    ax.set_xlabel("passages in the index before the write")
    ax.set_ylabel("ms per passage added (server)")
    ax.set_title(f"HTTP ingest in batches of {out['batch']}, {out['clients']} clients searching")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_fairness(paths, out: Path) -> None:
    """A's throughput beside B's overload as a share of A's alone, closed and open loop, one pair of bars per
    fairness JSON (labelled by its file name), and the 70% target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(Path(p).stem.replace("store_fairness_", ""), json.loads(Path(p).read_text())) for p in paths]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(runs)), 3.8))
    xs = range(len(runs))
    ax.bar([x - 0.2 for x in xs], [100 * r["closed_kept"] for _, r in runs], 0.4, label="A closed loop (8 clients)")
    ax.bar([x + 0.2 for x in xs], [100 * r["open_kept"] for _, r in runs], 0.4, label="A open loop at half its capacity")
    ax.axhline(70, color="k", ls="--", lw=1, label="target 70%")
    ax.set_xticks(list(xs), [name for name, _ in runs], fontsize=8)
    ax.set_ylabel("A's throughput beside B at 4x, % of alone")
    ax.set_ylim(0, 135)
    ax.legend(fontsize=7, loc="upper center", ncol=3)
    ax.set_title("Two indexes in one store: A beside B's 4x overload")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["plot-fairness"]:  # python -m benchmarks.store plot-fairness OUT.png RUN.json...
        plot_fairness(argv[2:], Path(argv[1]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("memory")
    m.add_argument("--indexes", nargs=2, required=True)
    m.add_argument("--questions")
    g = sub.add_parser("ingest")
    g.add_argument("--index", required=True)
    g.add_argument("--more", required=True)
    g.add_argument("--questions", required=True)
    g.add_argument("--full", required=True)
    g.add_argument("--batch", type=int, default=10)
    g.add_argument("--clients", type=int, default=32)
    k = sub.add_parser("kill")
    k.add_argument("--index", required=True)
    k.add_argument("--more", required=True)
    k.add_argument("--trials", type=int, default=20)
    k.add_argument("--batch", type=int, default=10)
    k.add_argument("--min-delay", type=float, default=0.0, help="seconds after the server is up, at least")
    k.add_argument("--max-delay", type=float, default=12.0, help="... and at most, before the kill")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--start-timeout", type=float, default=1800.0, help="seconds a server may take to load")
    f = sub.add_parser("fairness")
    f.add_argument("--indexes", nargs=2, required=True)
    f.add_argument("--questions", required=True)
    f.add_argument("--seconds", type=float, default=30.0)
    f.add_argument("--clients", type=int, default=8)
    for s in (m, g, k, f):
        s.add_argument("--out")
        s.add_argument("--server-log", help="append the servers' output to this file")
    args = p.parse_args(argv)
    run = {"memory": run_memory, "ingest": run_ingest, "kill": run_kill, "fairness": run_fairness}[args.mode]
    t0 = time.time()
    out = {"mode": args.mode, "date": time.strftime("%Y-%m-%d", time.gmtime(t0)), "argv": sys.argv[1:],
           **run(args), "wall_seconds": round(time.time() - t0, 1)}
    path = Path(args.out or ROOT / "benchmarks" / "results" / f"store_{args.mode}_{out['date']}.json")
    path.write_text(json.dumps(out, indent=1, default=str))
    if args.mode == "ingest":
        plot_ingest(out, path.with_suffix(".png"))
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
