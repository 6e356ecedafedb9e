"""The suite's own helpers (../harness.py and conftest.py) on fake programs:
no GPU, no nvcc, no artefacts. Run with -m harness:

  python3 -m pytest scripts/gpu/tests -m harness
"""
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest

import harness

pytestmark = pytest.mark.harness

HERE = os.path.dirname(os.path.abspath(__file__))


def script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_parse_kv():
    d = harness.parse_kv('mode=info total=42 name="NVIDIA H200" empty= x.y-z=1,2')
    assert d == {"mode": "info", "total": "42", "name": "NVIDIA H200", "empty": "", "x.y-z": "1,2"}
    assert harness.parse_kv("") == {}
    assert harness.parse_kv(None) == {}


def test_sizes_and_numbers():
    assert harness.mib(4 << 30) == "4096 MiB"
    assert harness.mib(str(3 * harness.MiB // 2)) == "1.5 MiB"
    assert harness.mib(None) == "?"
    assert harness.mib("none") == "none"
    assert harness.as_int("12") == 12 and harness.as_int("1.5") is None and harness.as_int(None) is None
    assert harness.median(["3", "1", "2"]) == 2 and harness.median(["1", "x", "3", "4"]) == 3
    assert harness.median([]) is None
    assert harness.ratio("2", "3") == "1.50" and harness.ratio("0", "3") == "NA" and harness.ratio(None, 1) == "NA"


def test_run_returns_the_result_lines_as_dicts(tmp_path):
    prog = script(tmp_path, "prog", """\
        echo "INFO device_name=\\"Fake GPU\\""
        echo "RESULT mode=a bytes=1"
        echo "RESULT mode=b bytes=2"
        echo "RESULTKV oom=1 total=$VRAMCAP_LIMIT"
        echo "to stderr" >&2
        exit 3
        """)
    log = tmp_path / "log"
    r = harness.Runner(str(log)).run("prog", [prog], env=harness.Runner(None).env(VRAMCAP_LIMIT="4GiB"))
    assert r.rc == 3
    assert r.kv("RESULT") == {"mode": "b", "bytes": "2"}
    assert [d["mode"] for d in r.lines("RESULT")] == ["a", "b"]
    assert r.kv() == {"oom": "1", "total": "4GiB"}
    assert r.kv("INFO") == {"device_name": "Fake GPU"}
    assert r.kv("NOTHING") == {}
    assert r.stderr.strip() == "to stderr"
    assert r.note == "module missing or no GPU backend" and r.describe() == "rc=3 (module missing or no GPU backend)"
    text = log.read_text()
    assert "=== prog ===" in text and "rc: 3" in text and "RESULT mode=b" in text and "VRAMCAP_LIMIT=4GiB" in text


def test_environment_drops_inherited_settings():
    rn = harness.Runner(None, env={"PATH": "/bin", "LD_PRELOAD": "x.so", "VRAMCAP_LIMIT": "1GiB",
                                   "PYTORCH_CUDA_ALLOC_CONF": "y", "KEEP": "1"})
    e = rn.env()
    assert e == {"PATH": "/bin", "KEEP": "1"}
    e = rn.env(shim="/a/libvramcap.so", VRAMCAP_LIMIT="2GiB", KEEP=None)
    assert e == {"PATH": "/bin", "LD_PRELOAD": "/a/libvramcap.so", "VRAMCAP_LIMIT": "2GiB"}


def test_timeout_kills_the_process_group(tmp_path):
    marker = tmp_path / "grandchild-alive"
    prog = script(tmp_path, "hang", """\
        (sleep 3; touch %s) &
        echo "RESULT started=1"
        sleep 30
        """ % marker)
    t0 = time.monotonic()
    r = harness.Runner(None).run("hang", [prog], timeout=1)
    assert time.monotonic() - t0 < 10
    assert r.timed_out and r.note.startswith("TIMEOUT")
    assert r.kv("RESULT") == {"started": "1"}  # what it printed before is kept
    time.sleep(3.5)
    assert not marker.exists(), "the grandchild outlived the timeout"


def test_missing_program_is_reported_not_raised(tmp_path):
    r = harness.Runner(None).run("nothing", [str(tmp_path / "no-such-program")])
    assert r.rc == 127 and "could not execute" in r.note


def test_spent_budget_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    prog = script(tmp_path, "p", "touch %s\n" % marker)
    r = harness.Runner(None, deadline=time.monotonic() + 1).run("p", [prog])
    assert r.rc is None and r.not_run and r.note.startswith("not run")
    assert not marker.exists()
    # and a timeout is cut to what is left of the budget
    r = harness.Runner(None, deadline=time.monotonic() + 7).run("p", ["sleep", "30"], timeout=100)
    assert r.timed_out and r.seconds < 10


def test_run_holding_answers_each_hold(tmp_path):
    prog = script(tmp_path, "holder", """\
        echo "HOLDING pid=$$ what=first free=1 total=2"
        read line
        echo "GOT $line"
        echo "HOLDING pid=$$ what=second free=1 total=2"
        read line
        echo "RESULT done=1"
        """)
    seen = []

    def on_hold(d):
        seen.append(d["what"])
        return "NVML what=%s pid=%s used_mib=7" % (d["what"], d["pid"])

    r = harness.Runner(None).run_holding("holder", [prog], timeout=20, on_hold=on_hold)
    assert r.rc == 0 and not r.timed_out
    assert seen == ["first", "second"]
    assert [d["what"] for d in r.lines("NVML")] == ["first", "second"]
    assert "GOT go" in r.stdout
    assert r.kv("RESULT") == {"done": "1"}


def test_run_holding_times_out(tmp_path):
    prog = script(tmp_path, "stuck", 'echo "HOLDING pid=$$ what=x"\nread line\nsleep 60\n')
    t0 = time.monotonic()
    r = harness.Runner(None).run_holding("stuck", [prog], timeout=2, on_hold=lambda d: None)
    assert r.timed_out and time.monotonic() - t0 < 20


def test_nvidia_smi_apps_are_summed():
    text = "123, GPU-a, 500\n123, GPU-b, 100\n456, GPU-a, 7\n123, GPU-a, 20\n"
    assert harness.sum_apps(text, 123, "GPU-a") == 520
    assert harness.sum_apps(text, 123) == 620
    assert harness.sum_apps(text, 999) == "missing"
    assert harness.sum_apps("123, GPU-a, [N/A]\n", 123) == "n/a"


def test_builds_fall_back_and_cache(tmp_path):
    calls = tmp_path / "calls"
    nvcc = script(tmp_path, "nvcc", """\
        echo "$*" >> %s
        case "$*" in *stubs*) ;; *) echo "cannot find -lcuda" >&2; exit 1 ;; esac
        for a; do [ "$prev" = -o ] && : > "$a"; prev=$a; done
        """ % calls)
    b = harness.Builds(str(tmp_path), str(tmp_path), nvcc, "sm_90")
    out = b.build("prog")
    assert os.path.exists(out)
    assert b.build("prog") == out
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and "-arch=sm_90" in lines[0] and "stubs" in lines[1]
    bad = harness.Builds(str(tmp_path), str(tmp_path), str(tmp_path / "no-nvcc"))
    with pytest.raises(harness.BuildError, match="nvcc not found"):
        bad.build("prog")


def test_check_records_and_judges():
    c = harness.Check("row")
    assert c.eq("total", "4096", 4096)
    assert not c.eq("err", None, 2)
    assert c.within("bytes", "10", 5, 10)
    assert not c.within("bytes", "5", 5, 10, lo_open=True)
    assert not c.within("bytes", "x", 5, None)
    assert c.at_most("ratio", "1.05", 1.1) and not c.at_most("ratio", None, 1.1)
    assert c.ne("seen", "1", 0) and not c.ne("seen", None, 0)
    assert len(c.failures) == 5
    assert "total = 4096" in c.expected_text() and "err=none ✗" in c.observed_text()


def test_table_escapes_and_is_written_each_row(tmp_path):
    t = harness.Table(str(tmp_path / "t.md"), "header")
    t.add("a|b", "x", "y", "PASS")
    assert "a\\|b" in (tmp_path / "t.md").read_text()
    t.add("c", "x", "y", "FAIL")
    text = (tmp_path / "t.md").read_text()
    assert "2 checks, 1 passed, 1 not passed" in text


# ---------------------------------------------------------------- the conftest, end to end

def run_suite(tmp_path, tests_src, *args, artefacts=True):
    """A copy of the suite's conftest and pytest.ini with TESTS_SRC as its one
    test file, run by pytest in a subprocess; (rc, table text, stdout)."""
    suite = tmp_path / "gpu" / "tests"
    suite.mkdir(parents=True)
    shutil.copy(os.path.join(HERE, "conftest.py"), suite)
    shutil.copy(os.path.join(HERE, "pytest.ini"), suite)
    shutil.copy(os.path.join(os.path.dirname(HERE), "harness.py"), suite.parent)
    (suite / "test_fake.py").write_text(textwrap.dedent(tests_src))
    argv = [sys.executable, "-m", "pytest", str(suite), "-m", "", "--out", str(tmp_path / "out")]
    if artefacts:
        art = tmp_path / "art"
        art.mkdir()
        (art / "libvramcap.so").write_text("")
        script(art.parent / "art", "vramcap", 'case "$1" in size) echo 4294967296 ;; esac\n')
        argv += ["--artefacts", str(art)]
    p = subprocess.run(argv + list(args), capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k not in ("OUT", "VRAMCAP_ARTEFACTS")})
    table = tmp_path / "out" / "gpu-tests.md"
    return p.returncode, table.read_text() if table.exists() else "", p.stdout + p.stderr


FAKE = """\
    import pytest

    def test_good(gpu, cap, check):
        check.title = "good row"
        check.eq("cap", int(cap), 4 << 30)

    def test_bad(gpu, check):
        check.title = "bad row"
        check.eq("value", "1", 2)
        check.eq("other", "3", 3)

    def test_says_nothing(gpu, check):
        check.title = "silent row"

    def test_raises(gpu, check):
        check.title = "raising row"
        raise RuntimeError("boom")

    def test_build(build, check):
        check.title = "build row"
        check.that(build("nothing-here"), "built", "")
"""


def test_suite_rows_and_verdicts(tmp_path):
    rc, table, out = run_suite(tmp_path, FAKE, "--nvcc", str(tmp_path / "no-nvcc"))
    assert rc == 1, out
    rows = {l.split(" | ")[0].lstrip("| "): l for l in table.splitlines() if l.startswith("| ") and "---" not in l}
    assert rows["good row"].endswith("| PASS |")
    assert "cap = 4294967296" in rows["good row"]
    assert rows["bad row"].endswith("| FAIL |") and "value=1 ✗" in rows["bad row"] and "other=3" in rows["bad row"]
    assert rows["silent row"].endswith("| FAIL |")
    assert rows["raising row"].endswith("| FAIL |") and "boom" in rows["raising row"]
    assert rows["build row"].endswith("| FAIL |") and "nvcc not found" in rows["build row"]
    assert "5 checks, 1 passed, 4 not passed" in table
    assert "vramcap GPU table" in out  # the table is printed last too


def test_suite_without_artefacts_passes_nothing(tmp_path):
    rc, table, out = run_suite(tmp_path, FAKE, artefacts=False)
    assert rc == 1, out
    assert "| PASS |" not in table
    assert table.count("| ERROR |") == 5 and "no artefacts" in table


def test_suite_budget_and_test_timeout(tmp_path):
    src = """\
        import time

        def test_slow(gpu, check):
            check.title = "slow row"
            time.sleep(30)
            check.that(True, "x", "y")

        def test_after(gpu, check):
            check.title = "after row"
            check.that(True, "x", "y")
    """
    t0 = time.monotonic()
    rc, table, out = run_suite(tmp_path, src, "--test-timeout", "6", "--budget", "4")
    assert time.monotonic() - t0 < 60
    assert rc == 1, out
    assert "| slow row |" in table and "--test-timeout" in table
    assert "not run: the time budget" in table


def test_real_suite_collects_and_passes_nothing_without_a_gpu(tmp_path):
    """The real smoke set with no artefacts: every row errors, none passes."""
    p = subprocess.run([sys.executable, "-m", "pytest", HERE, "-m", "smoke", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k not in ("OUT", "VRAMCAP_ARTEFACTS")})
    table = (tmp_path / "gpu-tests.md").read_text()
    assert p.returncode != 0
    assert "| PASS |" not in table and " passed" not in p.stdout.splitlines()[-1].replace("0 passed", ""), p.stdout


def test_whole_suite_collects_without_a_gpu(tmp_path):
    """Every row of every marker collects here, with no GPU, nvcc or artefacts."""
    p = subprocess.run([sys.executable, "-m", "pytest", HERE, "--collect-only", "-q", "-m", "not harness"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert "error" not in last and int(last.split("/")[0]) >= 100, last
