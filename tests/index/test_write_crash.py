"""A writer that dies anywhere in its write leaves a whole index: the one before or the one after.

In process, fast: the write is stopped after each of its steps in turn (an exception that no clean-up catches,
as a kill leaves the files), and the folder then loads verified and equals the index before or after.
With real processes (slow set): benchmarks/write_crash.py's 50 trials of `linearrag add` / `delete` killed with
SIGKILL at seeded random points, each followed by the checks of that program (load with the sha256 manifest,
equality with one of the two reference states, the lock free at once).
"""
import json
import re
from pathlib import Path

import pytest

from linearrag_torch.index import TriGraphIndex, index_lock, storage

from conftest import write_jsonl
from test_index_io import assert_same_index, sample_index


class Crash(BaseException):
    """Not an Exception: nothing in the write catches it, as nothing runs after a SIGKILL."""


LEFTOVER = "index.json.0123456789ab.tmp"  # as an earlier crashed write leaves it


def untagged(step: str) -> str:
    return re.sub(r"-[0-9a-f]{12}\.", "-TAG.", step)  # each write names its files with a new tag


def old_folder(path, index):
    index.save(path)
    (path / LEFTOVER).write_text("{}")
    return path


def write_steps(path, index) -> list:
    """The step names of one write of ``index`` to ``path``."""
    names = []
    real = storage._stepper
    storage._stepper = lambda p: names.append
    try:
        index.save(path)
    finally:
        storage._stepper = real
    return names


def test_a_write_stopped_after_any_step_leaves_the_old_or_the_new_index(tmp_path, monkeypatch):
    old, new = sample_index(seed=1), sample_index(seed=2, passages=12, entities=9)
    steps = write_steps(old_folder(tmp_path / "probe", old), new)
    assert steps[0] == "begin" and steps[-1] == "end" and "index.json replaced" in steps and len(steps) >= 10
    assert f"removed {LEFTOVER}" in steps
    commit = steps.index("index.json replaced")
    for k, name in enumerate(steps):
        path = old_folder(tmp_path / f"stopped-{k}", old)

        def stepper(p, k=k):
            seen = []

            def step(n):
                seen.append(n)
                if len(seen) == k + 1:
                    raise Crash(n)
            return step

        monkeypatch.setattr(storage, "_stepper", stepper)
        with pytest.raises(Crash) as stopped:
            new.save(path)
        assert untagged(str(stopped.value)) == untagged(name)
        monkeypatch.undo()
        loaded = TriGraphIndex.load(path, verify=True)
        assert_same_index(loaded, new if k >= commit else old)
        named = set(json.loads((path / "index.json").read_text())["files"].values())
        assert named <= {p.name for p in path.iterdir()}
        old.save(path)  # the next write cleans up what the stopped one left
        named = json.loads((path / "index.json").read_text())["files"].values()
        assert {p.name for p in path.iterdir()} == {"index.json", *named}


def test_safetensors_io_errors_become_os_errors(tmp_path, monkeypatch):
    """safetensors reports a full disk as SafetensorError("... (os error 28)"): the write turns it into the OSError
    it is (so that its clean-up and the CLI's one-line error apply); any other SafetensorError stays one."""
    from safetensors import SafetensorError

    path = sample_index(seed=1).save(tmp_path / "idx")
    before = sorted(p.name for p in path.iterdir())

    def failing(message):
        def save_file(tensors, filename, *args, **kwargs):
            Path(filename).write_bytes(b"\0" * 100)
            raise SafetensorError(message)
        return save_file

    monkeypatch.setattr(storage, "save_file",
                        failing("Error while serializing: I/O error: No space left on device (os error 28)"))
    with pytest.raises(OSError, match=r"cannot write the index to .*idx: No space left on device; the index there is "
                                      "unchanged") as info:
        sample_index(seed=2).save(path)
    assert info.value.errno == 28
    assert sorted(p.name for p in path.iterdir()) == before
    monkeypatch.setattr(storage, "save_file", failing("Error while serializing: something else"))
    with pytest.raises(SafetensorError):
        sample_index(seed=2).save(path)


def test_fifty_writers_killed_at_random_points_leave_a_whole_index(small_index_dir, tmp_path):
    """Slow set: 50 real writer processes killed with SIGKILL (benchmarks/write_crash.py)."""
    from benchmarks.write_crash import run_trials

    more = write_jsonl(tmp_path / "more.jsonl", [
        {"id": "crash-1", "title": "Zorblax Quentavian",
         "text": "Zorblax Quentavian was a chemist born in Vormelund who discovered glowing salt."},
        {"id": "crash-2", "title": "Vormelund",
         "text": "Vormelund is a harbour town on the Quentavian coast, known for its salt works."}])
    result = run_trials(Path(small_index_dir), more, trials=50, seed=0, step_pause=0.1, whole_run_share=0.2,
                        work=tmp_path / "work")
    s = result["summary"]
    assert s["trials"] == 50 and s["killed"] >= 40 and s["killed_inside_the_write"] >= 30, s
    assert s["damaged_or_unloadable"] == 0 and s["neither_before_nor_after"] == 0 and s["unexpected"] == 0, s
    assert s["lock_blocked"] == 0 and s["stale_lock_files_left"] > 0, s  # dead writers' files, never their lock
    assert set(s["states_found"]) == {"S0", "S1"}, s  # kills landed both before and after the commit
    assert s["final_write"]["exit"] == 0 and not s["final_write"]["files_left"], s
    with index_lock(small_index_dir):  # the source index was never written
        pass
