"""`linearrag add` into a disk that fills up, on a real size-limited tmpfs, while `linearrag serve` serves the index.

The tmpfs is mounted in a private mount namespace (`unshare --mount`, with `--map-root-user` when not root), so that
it needs no privilege where user namespaces are allowed and vanishes with the processes; the test is skipped, saying
why, where it cannot be mounted (tests/index/test_updates.py simulates the same error without one). Inside the
namespace a shell script copies the small index onto the tmpfs, starts the server on it and runs the real
`linearrag add` twice: with room for the new strings file but not for the new tensors (the disk fills during the
write), then with the disk filled to the last byte. Outside, the test checks that each add ends with one error line
naming the folder, that the folder is byte for byte what it was, and that the server keeps answering the same
results and reloads the folder (verified) with the same fingerprint.
"""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from conftest import SMALL_CORPUS_SIZE, write_jsonl  # noqa: E402
from test_serve import free_port  # noqa: E402

TIMEOUT = 240  # seconds any single wait may take (a cold server start on 2 busy cores)

SCRIPT = r"""
set -u
M="$1"; SRC="$2"; T="$3"; PORT="$4"; MORE="$5"; SIZE_K="$6"
wait_for() { n=0; while [ ! -e "$T/$1" ]; do sleep 0.2; n=$((n+1)); [ $n -gt 1500 ] && return 1; done; return 0; }
mount -t tmpfs -o size=${SIZE_K}k tmpfs "$M" || exit 90
cp -a "$SRC" "$M/idx"
listing() { (cd "$M/idx" && ls -A && sha256sum -- *); }
listing > "$T/before.txt"
"$PY" -m linearrag_torch.cli serve "$M/idx" --port "$PORT" --device cpu --log-level warning 2> "$T/server.err" &
S=$!
for round in 1 2; do
  wait_for go$round || { kill -TERM $S; exit 91; }
  if [ $round = 2 ]; then dd if=/dev/zero of="$M/filler" bs=4096 2> /dev/null; fi
  df -k "$M" | tail -1 > "$T/df$round"
  "$PY" -m linearrag_torch.cli add "$M/idx" "$MORE" --quiet --device cpu 2> "$T/add$round.err"
  rc=$?
  listing > "$T/after$round.txt"
  echo $rc > "$T/add$round.rc.tmp"; mv "$T/add$round.rc.tmp" "$T/add$round.rc"
done
wait_for stop
kill -TERM $S; wait $S; echo $? > "$T/server.rc"
"""


def unshare_command():
    """The unshare prefix that can mount a tmpfs here, or pytest.skip saying why none can."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        pytest.skip("needs Linux with util-linux's unshare (a private mount namespace for the tmpfs)")
    cmd = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    probe = subprocess.run(cmd + ["sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr.strip()}")
    return cmd


def digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def wait_file(path: Path, proc) -> str:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert proc.poll() is None, f"the namespace script ended ({proc.returncode}): {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {path.name} after {TIMEOUT} s"
        time.sleep(0.2)
    return path.read_text()


def search(url, questions):
    r = httpx.post(url + "/v1/search", json={"questions": questions, "top_k": 5}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return [[(h["id"], round(h["score"], 5)) for h in res["hits"]] for res in r.json()["results"]]


def test_add_into_a_full_tmpfs_fails_in_one_line_and_the_served_index_stays(small_index_dir, small_questions, tmp_path):
    cmd = unshare_command()
    size_k = sum(p.stat().st_size for p in Path(small_index_dir).iterdir()) // 1024 + 160  # the strings file fits
    mount, control = tmp_path / "mnt", tmp_path / "control"
    mount.mkdir()
    control.mkdir()
    (control / "src").mkdir()
    src = Path(shutil.copytree(small_index_dir, control / "src" / "idx"))
    before = digest(src)
    more = write_jsonl(tmp_path / "more.jsonl", [
        {"id": "disk-1", "title": "Zorblax Quentavian",
         "text": "Zorblax Quentavian was a chemist born in Vormelund who discovered glowing salt."}])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PY": sys.executable, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd + ["bash", "-c", SCRIPT, "full-disk", str(mount), str(src), str(control), str(port),
                                   str(more), str(size_k)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    questions = [q["question"] for q in small_questions]
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert proc.poll() is None, f"the namespace script ended ({proc.returncode}): {proc.stderr.read()}"
            try:
                health = httpx.get(url + "/health", timeout=10)
                if health.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server on the tmpfs did not become ready"
            time.sleep(0.3)
        fingerprint = health.json()["fingerprint"]
        served = search(url, questions)
        idx = mount / "idx"  # the path as the processes in the namespace see it
        for round_ in (1, 2):
            (control / f"go{round_}").touch()
            rc = int(wait_file(control / f"add{round_}.rc", proc))
            err = (control / f"add{round_}.err").read_text()
            free_k = int((control / f"df{round_}").read_text().split()[3])
            assert rc == 2 and err.count("\n") == 1, (round_, free_k, err)
            assert err.startswith(f"linearrag add: error: [Errno 28] cannot write the index to {idx}: "
                                  "No space left on device; the index there is unchanged"), err
            assert (free_k > 0) == (round_ == 1), free_k  # room for a part of the write, then none at all
            # every file as it was, no new one (the .lock file and the parts written are gone)
            assert (control / f"after{round_}.txt").read_text() == (control / "before.txt").read_text()
            # the server reloads it, verified: the same index, the same answers
            r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
            assert r.status_code == 200 and r.json()["fingerprint"] == fingerprint, r.text
            assert r.json()["index"]["passages"] == SMALL_CORPUS_SIZE
            assert search(url, questions) == served
        (control / "stop").touch()
        assert proc.wait(TIMEOUT) == 0, proc.stderr.read()
        assert (control / "server.rc").read_text().strip() == "0", (control / "server.err").read_text()
    finally:
        (control / "stop").touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    assert digest(src) == before  # the source copy outside the namespace was only read
