"""Server settings A/B under the same load, alternated: capacity and overload phases against one `linearrag serve` per
run, the runs taking the settings in turn, so that the machine's drift (its speed moves by 20-40% within an hour on a
shared VM) falls on every setting alike.

    python -m benchmarks.serve_ab --index IDX --questions Q.jsonl --setting 'hold 0.5=--refusal-delay 0.5'
        --setting 'hold 1.0=--refusal-delay 1.0' [--rounds 3] [--sequence cap,agg16,cap,agg16] [--duration 15]
        --json OUT.json [--png OUT.png]

    # the same load against an older commit's server (a git worktree of it): --code gives a setting its checkout
    git worktree add ../old bc932d5
    python -m benchmarks.serve_ab --index IDX --questions Q.jsonl --setting 'main=' --setting 'bc932d5='
        --code bc932d5=../old --sequence cap,agg16,cap,agg4 --json OUT.json

A run starts a server with one setting's arguments and goes through ``--sequence``: ``cap`` is 16 well-behaved
clients (``--max-concurrent`` 16: the capacity), ``aggN`` N x 16 clients that retry 10 ms after a 429 whatever its
Retry-After, ``wbN`` N x 16 that back off as SearchClient does. Each overload phase's goodput is divided by the
capacity phase just before it (a ratio within the run). Every phase also records where the core-seconds went
and the engine's milliseconds per answered question by stage (NER, encoder, graph), as benchmarks.serve.cpu_split
reads them from the server's /metrics: the server's CPU, the clients', the engine's busy share. Reported per setting:
every ratio, their mean and range.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import serve as S
from benchmarks.common import machine
from linearrag_torch.corpus import read_questions

BASE = 16  # clients of the capacity phase, and --max-concurrent


def one_run(index: Path, questions: list, extra: tuple, sequence: list, args, code: Path | None = None) -> tuple:
    """(the server's version, a row per phase) of one run against a server started with ``extra`` (from the
    checkout ``code``, else the installed package)."""
    phase_args = argparse.Namespace(duration=args.duration, max_requests=10**9, timeout=60.0, client_processes=0,
                                    retry_storm=False, client_nice=0)
    srv = S.Server(index, "cpu", 64, 0.0, BASE, 60.0, extra_args=extra, code=code)
    rows, capacity = [], None
    try:
        srv.wait_ready()
        version = S.httpx.get(srv.url + "/info", timeout=10).json().get("version")
        for name in sequence:
            if name == "cap":
                r = S.phase(srv, name, questions, BASE, phase_args)
            else:
                kind, factor = re.fullmatch(r"(agg|wb)(\d+)", name).groups()
                r = S.phase(srv, name, questions, int(factor) * BASE, phase_args,
                            after_refusal="storm" if kind == "agg" else "backoff")
            row = {"phase": name, "clients": r["clients"], "goodput_qps": r["throughput_qps"],
                   "statuses": r["statuses"], "p99_ms": r["p99_ms"],
                   **{k: r.get(k) for k in ("stage_ms_per_question", "server_cpu_s", "client_cpu_s",
                                            "engine_busy_share", "core_s")}}
            if name == "cap":
                capacity = r["throughput_qps"]
            elif capacity:
                row["of_capacity"] = round(r["throughput_qps"] / capacity, 3)
            rows.append(row)
    finally:
        srv.stop()
    return version, rows


def commit_of(folder: Path | None) -> str | None:
    """The commit checked out in ``folder`` (None: the installed package, this repository's)."""
    try:
        return subprocess.run(["git", "-C", str(folder or Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def summary(runs: list) -> dict:
    out = {}
    for run in runs:
        for row in run["phases"]:
            if "of_capacity" in row:
                out.setdefault(run["setting"], {}).setdefault(row["phase"], []).append(row["of_capacity"])
    return {s: {p: {"ratios": v, "mean": round(sum(v) / len(v), 3), "min": min(v), "max": max(v)}
                for p, v in phases.items()} for s, phases in out.items()}


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = []
    for i, (setting, phases) in enumerate(result["summary"].items()):
        for phase, s in phases.items():
            x = len(labels)
            labels.append(f"{setting}\n{phase}")
            ax.bar(x, s["mean"], color=f"C{i}", alpha=0.6)
            ax.plot([x] * len(s["ratios"]), s["ratios"], "k.", markersize=5)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("goodput / the run's capacity")
    ax.axhline(0.8, color="k", linestyle="--", linewidth=0.8)
    ax.set_title(f"serve_ab, {result['date'][:10]} (bars: mean; dots: each run)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--index", type=Path, required=True, help="the index folder `linearrag serve` loads")
    ap.add_argument("--questions", type=Path, required=True, help="questions.jsonl the clients send")
    ap.add_argument("--setting", action="append", required=True, metavar="NAME=SERVER_ARGS",
                    help="a setting: its name and the `linearrag serve` arguments it adds (empty: the defaults)")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                    help="the setting NAME's server runs from DIR, a checkout of another commit (git worktree add DIR "
                         "COMMIT), instead of the installed package: the same load against two versions of the code")
    ap.add_argument("--rounds", type=int, default=2, help="runs per setting, alternated (default 2)")
    ap.add_argument("--sequence", default="cap,agg16,cap,agg16",
                    help="phases of a run: cap, aggN, wbN, comma-separated (default cap,agg16,cap,agg16)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds a phase (default 15)")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--png", type=Path, help="plot (default: the JSON's path with .png)")
    args = ap.parse_args(argv)
    settings = {}
    for item in args.setting:
        name, sep, extra = item.partition("=")
        if not sep or not name:
            ap.error(f"--setting {item!r}: expected NAME=SERVER_ARGS")
        settings[name] = tuple(extra.split())
    codes = {}
    for item in args.code:
        name, sep, folder = item.partition("=")
        if name not in settings or not (Path(folder) / "linearrag_torch").is_dir():
            ap.error(f"--code {item!r}: expected NAME=DIR, NAME a --setting and DIR a checkout of this repository")
        codes[name] = Path(folder)
    sequence = args.sequence.split(",")
    for name in sequence:
        if name != "cap" and not re.fullmatch(r"(agg|wb)\d+", name):
            ap.error(f"--sequence: unknown phase {name!r} (cap, aggN, wbN)")
    questions = [q["question"] for q in read_questions(args.questions)]
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), "index": str(args.index), "duration_s": args.duration,
              "max_concurrent": BASE, "machine": machine(torch.device("cpu"), torch.get_num_threads()),
              "runs": []}
    for rnd in range(args.rounds):
        for name, extra in settings.items():
            t0 = time.perf_counter()
            version, phases = one_run(args.index, questions, extra, sequence, args, codes.get(name))
            result["runs"].append({"setting": name, "server_args": " ".join(extra), "round": rnd,
                                   "code": commit_of(codes.get(name)), "server_version": version,
                                   "seconds": round(time.perf_counter() - t0, 1), "phases": phases})
            print(f"[ab] {name} round {rnd}: " + ", ".join(
                f"{p['phase']} {p['goodput_qps']}" + (f" ({p['of_capacity']})" if "of_capacity" in p else "")
                for p in phases), file=sys.stderr, flush=True)
            result["summary"] = summary(result["runs"])
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1))
    plot(result, args.png or args.json.with_suffix(".png"))
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
