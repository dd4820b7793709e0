"""Index writers killed with SIGKILL at random points: does the folder always hold a whole index?

    python -m benchmarks.write_crash --index INDEX_DIR --more MORE.jsonl [--trials 50] [--seed 0]
        [--step-pause 0.1] [--whole-run-share 0.2] [--out benchmarks/results/write_crash_trials_DATE.json]

The folder (a copy of INDEX_DIR) is in one of two states: S0, the index given, or S1, S0 with the passages of
MORE.jsonl added. The trials alternate between the two real commands that move it from one state to the other
(`linearrag add DIR MORE.jsonl` from S0, `linearrag delete DIR --ids-file MORE.jsonl` from S1; when the last
trial left the folder in the other state, it is first replaced by a copy of the reference, else the trial
writes over what the last kill left: its stale .lock file and leftover files) and kill each with SIGKILL:

* most trials set LINEARRAG_TEST_WRITE_STEP_PAUSE, under which the write prints each step (strings file written,
  tensors file written, each file synced, index.json.tmp written, folder synced, index.json replaced, each old
  file removed, ...) and pauses after it; the kill comes a seeded random delay after the write's first step,
  drawn over the write's whole duration (and a tenth beyond it, so that some writers finish);
* the others (``--whole-run-share``) draw the delay over the whole run of the command from its start (start-up,
  the lock, loading, encoding, the write).

After each kill: the folder loads with verification (each data file's size and sha256 against index.json's
manifest), it equals S0 or S1 exactly (strings, every tensor, index.json's counts and settings), the state is
the one before or the one after this trial's write, and the write lock is free at once (the dead writer's .lock
file holds no lock). Every trial's step reached, the state found and the leftovers are in the JSON written to
--out. The two reference states come from the same commands run to the end before the trials.

Exit status 0 when no trial found a damaged index, a third state or a blocked lock.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch

from linearrag_torch.index import IndexFormatError, IndexLockedError, TriGraphIndex, index_lock
from linearrag_torch.index.storage import STEP_PAUSE_ENV

from .common import log

TIMEOUT = 600  # seconds one command may take before the run stops with an error


def state_of(path: Path):
    """(tensors, strings, index.json fields) of the index in ``path``, loaded with verification."""
    return TriGraphIndex.load(path, device="cpu", verify=True).to_files()


def same_state(a, b) -> bool:
    (ta, sa, fa), (tb, sb, fb) = a, b
    return sa == sb and fa == fb and ta.keys() == tb.keys() and all(
        ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]) for k in ta)


class Writer:
    """One `linearrag add` or `delete` process, its stderr read by a thread (lines with their arrival time)."""

    def __init__(self, op: str, folder: Path, more: Path, step_pause: float | None):
        argv = [sys.executable, "-m", "linearrag_torch.cli", op, str(folder)]
        argv += [str(more), "--quiet", "--device", "cpu"] if op == "add" else ["--ids-file", str(more)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.pop(STEP_PAUSE_ENV, None)
        if step_pause:
            env[STEP_PAUSE_ENV] = str(step_pause)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list = []
        self.began = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if line.rstrip("\n").endswith(": begin"):
                self.began.set()
        self.began.set()  # ended (or killed) without a write

    def steps(self) -> list:
        marker = f"{STEP_PAUSE_ENV}: "
        return [x.split(marker, 1)[1].split(": ", 1)[1] for x in self.lines if marker in x]

    def finish(self, timeout: float = TIMEOUT) -> int:
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(TIMEOUT)
        self.proc.stderr.close()
        return rc

    def kill(self) -> bool:
        """SIGKILL now; False if the process had already ended."""
        if self.proc.poll() is not None:
            return False
        os.kill(self.proc.pid, signal.SIGKILL)
        return True


def reference_run(op: str, folder: Path, more: Path, step_pause: float) -> tuple:
    """Run ``op`` on ``folder`` to its end with the step hook: (seconds, steps printed)."""
    w = Writer(op, folder, more, step_pause)
    rc = w.finish()
    if rc != 0:
        raise SystemExit(f"write_crash: the reference `linearrag {op}` on {folder} failed (exit {rc}):\n"
                         + "\n".join(w.lines[-20:]))
    return time.monotonic() - w.started, w.steps()


def run_trials(index: Path, more: Path, trials: int, seed: int, step_pause: float, whole_run_share: float,
               work: Path) -> dict:
    """The trials (module docstring); returns the summary and one record per trial."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    s0_dir, s1_dir, folder = work / "S0", work / "S1", work / "index"
    for d in (s0_dir, s1_dir, folder):
        shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(index, s0_dir)
    shutil.copytree(index, s1_dir)
    seconds = {}
    seconds["add"], add_steps = reference_run("add", s1_dir, more, step_pause)
    s0, s1 = state_of(s0_dir), state_of(s1_dir)
    check = work / "S0_again"
    shutil.rmtree(check, ignore_errors=True)
    shutil.copytree(s1_dir, check)
    seconds["delete"], delete_steps = reference_run("delete", check, more, step_pause)
    if not same_state(state_of(check), s0):
        raise SystemExit("write_crash: deleting MORE.jsonl's passages from S1 does not give S0 back exactly")
    if same_state(s0, s1):
        raise SystemExit("write_crash: MORE.jsonl adds nothing (S1 equals S0)")
    window = {"add": len(add_steps) * step_pause, "delete": len(delete_steps) * step_pause}
    log(f"references: add {seconds['add']:.1f} s ({len(add_steps)} write steps), delete {seconds['delete']:.1f} s "
        f"({len(delete_steps)} steps); step pause {step_pause} s")
    shutil.copytree(s0_dir, folder)
    current = "S0"
    records = []
    for trial in range(trials):
        op = ("add", "delete")[trial % 2]
        start, target = ("S0", "S1") if op == "add" else ("S1", "S0")
        reset = current != start
        if reset:  # the last kill left the other state: start from a copy of the reference
            shutil.rmtree(folder)
            shutil.copytree(s0_dir if start == "S0" else s1_dir, folder)
            current = start
        whole = rng.random() < whole_run_share
        if whole:
            delay = rng.uniform(0, seconds[op] * 1.1)
            w = Writer(op, folder, more, step_pause)
            time.sleep(max(0.0, delay - (time.monotonic() - w.started)))
        else:
            delay = rng.uniform(0, window[op] * 1.1)
            w = Writer(op, folder, more, step_pause)
            if not w.began.wait(TIMEOUT):
                w.kill()
                raise SystemExit(f"write_crash: trial {trial}: the writer printed no step in {TIMEOUT} s")
            time.sleep(delay)
        killed = w.kill()
        rc = w.finish()
        steps = w.steps()
        rec = {"trial": trial, "op": op, "folder_reset": reset, "delay_from": "start" if whole else "first write step",
               "delay_s": round(delay, 3), "killed": killed, "exit": rc,
               "last_step": steps[-1] if steps else None, "steps_done": len(steps),
               "stale_lock_file": (folder / ".lock").exists()}
        try:
            found = state_of(folder)
            rec["state"] = "S0" if same_state(found, s0) else "S1" if same_state(found, s1) else "other"
        except IndexFormatError as exc:
            rec["state"], rec["error"] = "damaged", str(exc)
        rec["as_expected"] = rec["state"] in (current, target) and (killed or rec["state"] == target)
        named = set(json.loads((folder / "index.json").read_text())["files"].values()) | {"index.json", ".lock"}
        rec["leftover_files"] = sorted(p.name for p in folder.iterdir() if p.name not in named)
        try:
            with index_lock(folder):
                rec["lock_free"] = True
        except IndexLockedError as exc:
            rec["lock_free"], rec["lock_error"] = False, str(exc)
        records.append(rec)
        log(f"trial {trial:3d} {op:6s} kill after {delay:6.3f} s from the {rec['delay_from']:16s} "
            f"last step {rec['last_step']!s:32s} -> {rec['state']} leftovers {len(rec['leftover_files'])}")
        current = rec["state"]  # a damaged folder or a third state: the next trial starts from a copy
    # one more writer to the end: the leftovers of killed writes go, the stale .lock file does not stop it
    if current not in ("S0", "S1"):
        shutil.rmtree(folder)
        shutil.copytree(s0_dir, folder)
        current = "S0"
    op = "add" if current == "S0" else "delete"
    rc = Writer(op, folder, more, None).finish()
    named = set(json.loads((folder / "index.json").read_text())["files"].values()) | {"index.json"}
    last = state_of(folder)
    final = {"op": op, "exit": rc, "files_left": sorted(p.name for p in folder.iterdir() if p.name not in named),
             "state": "S1" if same_state(last, s1) else "S0" if same_state(last, s0) else "other"}
    by_step = by_last_step(records)
    summary = {
        "trials": trials, "seed": seed, "step_pause_s": step_pause, "whole_run_share": whole_run_share,
        "trials_by_op": dict(Counter(r["op"] for r in records)),
        "killed": sum(r["killed"] for r in records),
        "finished_before_the_kill": sum(not r["killed"] for r in records),
        "killed_inside_the_write": sum(r["killed"] and 0 < r["steps_done"] for r in records),
        "states_found": dict(Counter(r["state"] for r in records)),
        "damaged_or_unloadable": sum(r["state"] == "damaged" for r in records),
        "neither_before_nor_after": sum(r["state"] == "other" for r in records),
        "unexpected": sum(not r["as_expected"] for r in records),
        "stale_lock_files_left": sum(r["stale_lock_file"] for r in records),
        "lock_blocked": sum(not r["lock_free"] for r in records),
        "trials_with_leftover_files": sum(bool(r["leftover_files"]) for r in records),
        "by_last_step": by_step,
        "reference_seconds": {k: round(v, 2) for k, v in seconds.items()},
        "write_steps": {"add": add_steps, "delete": delete_steps},
        "final_write": final,
        "seconds": round(time.monotonic() - t0, 1),
    }
    summary["ok"] = (summary["damaged_or_unloadable"] == summary["neither_before_nor_after"] == summary["unexpected"]
                     == summary["lock_blocked"] == 0 and final["exit"] == 0 and not final["files_left"])
    return {"summary": summary, "records": records}


def by_last_step(records: list) -> dict:
    """{"op: last step printed": {state found: trials}}, the files' tags left out (each write has its own)."""
    out = {}
    for r in records:
        step = re.sub(r"-[0-9a-f]{12}\.", "-TAG.", r["last_step"] or "(before the write)")
        out.setdefault(f"{r['op']}: {step}", Counter())[r["state"]] += 1
    return {k: dict(v) for k, v in sorted(out.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.write_crash", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", required=True, help="the index folder (copied; never written)")
    p.add_argument("--more", required=True, help="JSONL passages with new ids: added, then deleted by id")
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-pause", type=float, default=0.1, help="seconds the write pauses after each step")
    p.add_argument("--whole-run-share", type=float, default=0.2,
                   help="share of trials whose kill delay is drawn over the whole command, not its write")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    p.add_argument("--out", default=None, help="the JSON written (default: none, printed summary only)")
    p.add_argument("--machine", default=None, help="the machine's name stored with the results")
    p.add_argument("--note", default=None, help="a note stored with the results (other jobs on the cores, ...)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="write_crash_") as tmp:
        result = run_trials(Path(args.index), Path(args.more), args.trials, args.seed, args.step_pause,
                            args.whole_run_share, Path(args.work) if args.work else Path(tmp))
    result = {"benchmark": "write_crash", "date": time.strftime("%Y-%m-%d"), "machine": args.machine,
              "note": args.note, "command": "python -m benchmarks.write_crash " + shlex.join(argv or sys.argv[1:]),
              **result}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    log(json.dumps(result["summary"], indent=1))
    return 0 if result["summary"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
