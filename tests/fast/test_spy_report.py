"""reward_tools.spy_report: py-spy's collapsed stacks (`--format raw --threads --subprocesses`) summed
per thread, pools folded into one row, a child process's threads named after it."""

from __future__ import annotations

from reward_tools.spy_report import inclusive, main, read, summary

SERVER = 'process 614:"python3 -m reward_server --engine vllm"'
CORE = 'process 1029:"VLLM::EngineCore"'
LINES = [
    f"{SERVER};thread (1330): vllm-inputs_5;_render (vllm_engine.py:470);patchify (video.py:297) 7",
    f"{SERVER};thread (1331): vllm-inputs_6;_render (vllm_engine.py:470);normalize (misc.py:65) 3",
    f"{SERVER};thread (614): MainThread;run (runners.py:118);_reclaim (memory_release.py:76) 5",
    f"{SERVER};thread (614): MainThread;run (runners.py:118);_add (body.py:155) 2",
    f"{SERVER};{CORE};thread (1029): uvloop_0;step (core.py:1);_reduce_data (inputs.py:571) 4",
]


def test_samples_are_summed_per_thread_with_pools_folded_and_the_engine_core_named(tmp_path):
    path = tmp_path / "spy.txt"
    path.write_text("\n".join(LINES) + "\n")
    rows = read(path)
    totals: dict[str, int] = {}
    for thread, _, n in rows:
        totals[thread] = totals.get(thread, 0) + n
    assert totals == {"vllm-inputs_N": 10, "MainThread": 7, "VLLM::EngineCore/uvloop_N": 4}
    table = summary(rows, top=1)
    assert "| vllm-inputs_N | 10 | patchify (video.py:297) (7) |" in table
    assert table.index("vllm-inputs_N") < table.index("MainThread") < table.index("EngineCore")
    where = inclusive(rows, "MainThread", 5).splitlines()
    assert where[0].split() == ["7", "run", "(runners.py:118)"]
    assert any("_reclaim" in line and line.split()[0] == "5" for line in where)


def test_runs_as_a_command_on_a_gzipped_profile(tmp_path, capsys):
    import gzip

    path = tmp_path / "spy.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(LINES) + "\n")
    assert main([str(path), "--thread", "MainThread"]) == 0
    out = capsys.readouterr().out
    assert "MainThread, anywhere on the stack:" in out and "_add (body.py:155)" in out
