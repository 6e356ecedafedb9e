"""What the GPU suite (scripts/gpu/tests) and scripts/gpu_bench.py share: running
one program with a timeout into a log, its key=value lines as dicts, nvcc
builds made once, NVML's per-process figure from outside, sizes, and the
markdown table of rows. Plain Python (no pytest, no GPU): the suite's
test_harness.py tests it on fake programs.
"""
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time

MiB = 1 << 20
GiB = 1 << 30

# What the suite removes from every process's environment before setting
# the variables of one check (so nothing inherited changes what it checks).
UNSET = (
    "LD_PRELOAD", "VRAMCAP_LIMIT", "VRAMCAP_COUNT", "VRAMCAP_CONTEXT", "VRAMCAP_SPILL",
    "VRAMCAP_SPILL_LIMIT", "VRAMCAP_CACHE", "VRAMCAP_LOG", "VRAMCAP_LIBRARY",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_CLIENT_MEM_FRACTION", "CUPY_GPU_MEMORY_LIMIT",
)

_KV = re.compile(r'([A-Za-z_][\w.\-]*)=("[^"]*"|\S*)')


def parse_kv(line):
    """`PREFIX k=v k2="a b" ...` -> {"k": "v", "k2": "a b"} (values as text)."""
    out = {}
    for k, v in _KV.findall(line or ""):
        if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
            v = v[1:-1]
        out[k] = v
    return out


def as_int(v):
    """A whole number from text, else None."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?[0-9]+", v.strip()):
        return int(v)
    return None


def as_float(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def mib(b):
    """4294967296 -> '4096 MiB' (one decimal when not whole); other text as is."""
    n = as_int(b)
    if n is None:
        return "?" if b in (None, "") else str(b)
    if n % MiB == 0:
        return "%d MiB" % (n // MiB)
    return "%.1f MiB" % (n / MiB)


def median(xs):
    xs = sorted(x for x in (as_float(v) for v in xs) if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def ratio(a, b, fmt="%.2f"):
    """b / a as text, 'NA' when either is missing or not positive."""
    a, b = as_float(a), as_float(b)
    if a is None or b is None or a <= 0 or b <= 0:
        return "NA"
    return fmt % (b / a)


class Result:
    """One finished process: rc (None: it did not run), stdout, stderr, and
    `note` (timeout, signal, could not execute, not run)."""

    def __init__(self, name, argv, rc, stdout, stderr, seconds, timed_out=False, not_run=None):
        self.name, self.argv, self.rc = name, argv, rc
        self.stdout, self.stderr = stdout, stderr
        self.seconds, self.timed_out, self.not_run = seconds, timed_out, not_run

    def lines(self, prefix):
        """Every line of stdout that starts with PREFIX + a space, parsed."""
        return [parse_kv(l[len(prefix) + 1:]) for l in self.stdout.splitlines() if l.startswith(prefix + " ")]

    def kv(self, prefix="RESULTKV"):
        """The last line of stdout starting with PREFIX, as a dict ({} if none)."""
        got = self.lines(prefix)
        return got[-1] if got else {}

    def json(self, prefix="RESULT"):
        """The JSON of the last `RESULT {json}` line (result.py), {} if none."""
        import json
        for l in reversed(self.stdout.splitlines()):
            if l.startswith(prefix + " {"):
                try:
                    return json.loads(l[len(prefix) + 1:])
                except ValueError:
                    return {}
        return {}

    def has_line(self, regex, stream="stdout"):
        text = self.stdout if stream == "stdout" else self.stderr
        return re.search(regex, text, re.M) is not None

    def first_line(self, stream="stdout", width=120):
        text = self.stdout if stream == "stdout" else self.stderr
        for l in text.splitlines():
            if l.strip():
                return l.strip()[:width]
        return ""

    @property
    def note(self):
        if self.not_run:
            return "not run: " + self.not_run
        if self.timed_out:
            return "TIMEOUT after %.0f s" % self.seconds
        if self.rc in (126, 127):
            return "could not execute (rc=%s)" % self.rc
        if self.rc is not None and self.rc < 0:
            return "killed by signal %d" % -self.rc
        if self.rc == 3:
            return "module missing or no GPU backend"
        if self.rc not in (0, None):
            return "rc=%s" % self.rc
        return ""

    def describe(self):
        return "rc=%s%s" % (self.rc, (" (%s)" % self.note) if self.note and not self.note.startswith("rc=") else "")


class Runner:
    """Runs one program at a time into LOG (command, exit status, wall time,
    stdout and stderr), each with a timeout, at most what is left of an
    overall deadline (time.monotonic(); None: none)."""

    MIN_LEFT = 5

    def __init__(self, log_path, deadline=None, env=None):
        self.log_path = log_path
        self.deadline = deadline
        self.base_env = dict(os.environ if env is None else env)
        self.count = 0

    # -------------------------------------------------------------- environment
    def env(self, shim=None, **vars):
        """The base environment less UNSET, with LD_PRELOAD=shim when given and
        VARS (a value None removes the variable)."""
        e = {k: v for k, v in self.base_env.items() if k not in UNSET}
        if shim:
            e["LD_PRELOAD"] = str(shim)
        for k, v in vars.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = str(v)
        return e

    def _log(self, text):
        if not self.log_path:
            return
        with open(self.log_path, "a", encoding="utf-8", errors="replace") as f:
            f.write(text)

    def left(self):
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _timeout(self, timeout):
        """TIMEOUT, at most what is left of the deadline; None when less than
        MIN_LEFT seconds are left (nothing starts then)."""
        left = self.left()
        if left is not None:
            if left < self.MIN_LEFT:
                return None
            timeout = min(timeout, left)
        return timeout

    def _begin(self, name, argv, env):
        self.count += 1
        changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
        self._log("\n=== %s ===\nstart: %s\nenv: %s\ncmd: %s\n" % (
            name, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(changed.items())),
            " ".join(shlex.quote(str(a)) for a in argv)))

    def _end(self, r):
        self._log("rc: %s%s (wall %.1f s)\n--- stdout ---\n%s\n--- stderr ---\n%s\n--- end %s ---\n" % (
            r.rc, " TIMEOUT" if r.timed_out else "", r.seconds, r.stdout[-1000000:], r.stderr[-1000000:], r.name))

    def _prepare(self, name, argv, env, timeout):
        """(argv as strings, env, timeout, None) once the run is logged as
        begun, or (.., a not-run Result) when the time budget is spent."""
        argv = [str(a) for a in argv]
        env = self.env() if env is None else env
        to = self._timeout(timeout)
        if to is None:
            self._log("\n=== %s ===\nnot run: the time budget is spent\n" % name)
            return argv, env, to, Result(name, argv, None, "", "", 0.0, not_run="the time budget is spent")
        self._begin(name, argv, env)
        return argv, env, to, None

    def _not_executed(self, name, argv, e):
        r = Result(name, argv, 127, "", "could not execute: %s" % e, 0.0)
        self._end(r)
        return r

    def run(self, name, argv, env=None, timeout=120, stdin_text=None, cwd=None):
        """Runs ARGV (stdin /dev/null or STDIN_TEXT) and returns a Result. A
        timeout kills the process group; an overall deadline already passed
        returns a Result with rc None and not_run set."""
        argv, env, to, not_run = self._prepare(name, argv, env, timeout)
        if not_run is not None:
            return not_run
        t0 = time.monotonic()
        try:
            p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                                 start_new_session=True)
        except OSError as e:
            return self._not_executed(name, argv, e)
        timed_out = False
        try:
            out, err = p.communicate(input=stdin_text.encode() if stdin_text is not None else None, timeout=to)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(p)
            out, err = p.communicate()
        except BaseException:
            _kill_group(p)
            p.communicate()
            raise
        r = Result(name, argv, p.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                   time.monotonic() - t0, timed_out=timed_out)
        self._end(r)
        return r

    def run_holding(self, name, argv, env=None, timeout=60, on_hold=None, hold_prefix="HOLDING "):
        """Runs ARGV with its stdin and stdout as pipes: each stdout line
        starting with HOLD_PREFIX is handed to on_hold(parsed dict) while the
        program waits, whatever on_hold returns (a line) is added to the
        recorded stdout, and the program gets a line on its stdin. Returns a
        Result whose stdout has the program's lines and the added ones."""
        argv, env, to, not_run = self._prepare(name, argv, env, timeout)
        if not_run is not None:
            return not_run
        t0 = time.monotonic()
        try:
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            return self._not_executed(name, argv, e)
        lines = queue.Queue()
        err_chunks = []

        def pump_out():
            for raw in p.stdout:
                lines.put(raw.decode(errors="replace").rstrip("\n"))
            lines.put(None)

        def pump_err():
            err_chunks.append(p.stderr.read().decode(errors="replace"))

        threads = [threading.Thread(target=pump_out, daemon=True), threading.Thread(target=pump_err, daemon=True)]
        for t in threads:
            t.start()
        out, timed_out = [], False
        try:
            while True:
                left = to - (time.monotonic() - t0)
                if left <= 0:
                    timed_out = True
                    break
                try:
                    l = lines.get(timeout=left)
                except queue.Empty:
                    timed_out = True
                    break
                if l is None:
                    break
                out.append(l)
                if l.startswith(hold_prefix):
                    added = on_hold(parse_kv(l[len(hold_prefix):])) if on_hold else None
                    if added:
                        out.append(added)
                    try:
                        p.stdin.write(b"go\n")
                        p.stdin.flush()
                    except OSError:
                        pass
        except BaseException:
            _kill_group(p)  # e.g. the test's own timeout: nothing is left running
            raise
        finally:
            try:
                p.stdin.close()
            except OSError:
                pass
            if timed_out:
                _kill_group(p)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(p)
                p.wait()
            for t in threads:
                t.join(timeout=5)
        r = Result(name, argv, p.returncode, "\n".join(out) + "\n", "".join(err_chunks),
                   time.monotonic() - t0, timed_out=timed_out)
        self._end(r)
        return r


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            p.kill()
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- the commit

def commit_of(art, root):
    """ART/COMMIT (what is being run), else git (+dirty), else unknown."""
    if art:
        try:
            with open(os.path.join(art, "COMMIT")) as f:
                c = f.readline().strip()[:60]
                if c:
                    return c
        except OSError:
            pass
    try:
        c = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, timeout=10).stdout.strip()
        if c:
            d = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
            return c + ("+dirty" if d else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"


class Bench:
    """What the benchmarks (../gpu_bench.py, ../bench_gate.py) start from:
    the shim in ARTEFACTS, OUT made with an empty OUT/LOG_NAME, a temp folder
    (`work`), a Runner with BUDGET seconds (`rn`, in ENV), and the GPU's and
    the commit's names (`gpu`, `commit`). `shim` is None, after one line on
    stderr naming it, when the shim is missing."""

    def __init__(self, tool, artefacts, out, log_name, budget, env=None):
        self.art = os.path.realpath(artefacts)
        self.shim = os.path.join(self.art, "libvramcap.so")
        if not os.access(self.shim, os.R_OK):
            import sys
            print("%s: %s not found" % (tool, self.shim), file=sys.stderr)
            self.shim = None
            return
        os.makedirs(out, exist_ok=True)
        self.log = os.path.join(out, log_name)
        open(self.log, "w").close()
        self.src = os.path.dirname(os.path.abspath(__file__))
        import tempfile
        self.work = tempfile.mkdtemp(prefix="vramcap-%s." % tool)
        self.t0 = time.monotonic()
        self.rn = Runner(self.log, deadline=self.t0 + budget, env=env)
        q = smi_query(find_nvidia_smi(), "name,driver_version")
        self.gpu = "%s, driver %s" % (q[0][0], q[0][1]) if q and len(q[0]) >= 2 else "unknown"
        self.commit = commit_of(self.art, os.path.dirname(os.path.dirname(self.src)))


# ---------------------------------------------------------------- nvcc

def find_nvcc(explicit=None):
    if explicit:
        return explicit
    if os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        return "/usr/local/cuda/bin/nvcc"
    return shutil.which("nvcc")


class Builds:
    """nvcc builds of scripts/gpu/*.cu into WORKDIR, each made once per
    process: build(name) -> path, or raises BuildError with the log's tail.
    Links -lcuda; if the linker finds no libcuda.so, retries with the
    toolkit's stubs, then the driver's libcuda.so.1."""

    def __init__(self, src_dir, work_dir, nvcc, arch="sm_90", log=None):
        self.src_dir, self.work_dir, self.nvcc, self.arch, self.log = src_dir, work_dir, nvcc, arch, log
        self.done = {}

    def link_variants(self):
        cudadir = os.path.dirname(os.path.dirname(self.nvcc or "/usr/local/cuda/bin/nvcc"))
        return [
            ["-lcuda"],
            ["-L%s/lib64/stubs" % cudadir, "-lcuda"],
            ["-L%s/targets/x86_64-linux/lib/stubs" % cudadir, "-lcuda"],
            ["-L/usr/local/nvidia/lib64", "-l:libcuda.so.1"],
            ["-L/usr/lib/x86_64-linux-gnu", "-l:libcuda.so.1"],
        ]

    def try_build(self, name):
        """(the built path, "") or (None, why it did not build)."""
        try:
            return self.build(name), ""
        except Exception as e:  # noqa: BLE001 -- the caller shows it in a row
            return None, str(e)

    def build(self, name, flags=None, links=None):
        """name: the stem of scripts/gpu/NAME.cu. flags: instead of -arch
        (e.g. [] for bench_ab); links: one link list instead of the variants."""
        key = (name, tuple(flags or ()), tuple(links or ()))
        if key in self.done:
            if isinstance(self.done[key], BuildError):
                raise self.done[key]
            return self.done[key]
        if not self.nvcc or not os.access(self.nvcc, os.X_OK):
            err = BuildError("nvcc not found (pass --nvcc or set NVCC)")
            self.done[key] = err
            raise err
        src = os.path.join(self.src_dir, name + ".cu")
        out = os.path.join(self.work_dir, name + ("" if flags is None and links is None else "-%d" % len(self.done)))
        arch = ["-arch=" + self.arch] if flags is None else list(flags)
        tail = ""
        for link in ([links] if links is not None else self.link_variants()):
            argv = [self.nvcc, "-O2"] + arch + ["-o", out, src] + list(link)
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
                rc, text = p.returncode, p.stdout + p.stderr
            except (OSError, subprocess.TimeoutExpired) as e:
                rc, text = 1, str(e)
            if self.log:
                with open(self.log, "a") as f:
                    f.write("build: %s\nrc=%s\n%s\n" % (" ".join(argv), rc, text))
            if rc == 0:
                self.done[key] = out
                return out
            tail = text[-800:]
        err = BuildError("nvcc could not build %s.cu: %s" % (name, tail.strip()))
        self.done[key] = err
        raise err


class BuildError(Exception):
    pass


# ---------------------------------------------------------------- NVML from outside

def find_nvidia_smi():
    for c in (shutil.which("nvidia-smi"), "/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def smi_query(smi, fields, env=None):
    """nvidia-smi --query-gpu=FIELDS as a list of lists of text ([] on failure)."""
    if not smi:
        return []
    try:
        p = subprocess.run([smi, "--query-gpu=" + fields, "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if p.returncode != 0:
        return []
    return [[c.strip() for c in l.split(",")] for l in p.stdout.splitlines() if l.strip()]


def nvml_used_mib(smi, pid, uuid=None, env=None, log=None):
    """MiB that nvidia-smi (no shim) lists for PID (on UUID when given),
    summed over its entries: an int, or 'missing', 'n/a', 'error'."""
    if not smi:
        return "error"
    try:
        p = subprocess.run([smi, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        if log:
            log("nvidia-smi failed: %s\n" % e)
        return "error"
    if log:
        log("nvidia-smi --query-compute-apps (for pid %s):\n%s\n" % (pid, p.stdout + p.stderr))
    if p.returncode != 0:
        return "error"
    return sum_apps(p.stdout, pid, uuid)


def sum_apps(text, pid, uuid=None):
    n, total, bad = 0, 0, False
    for l in text.splitlines():
        cols = [c.strip() for c in l.split(",")]
        if len(cols) < 3 or cols[0] != str(pid) or (uuid and cols[1] != uuid):
            continue
        n += 1
        v = as_int(cols[2])
        if v is None:
            bad = True
        else:
            total += v
    if not n:
        return "missing"
    return "n/a" if bad else total


def wait_line(path, prefix, seconds, proc, anywhere=False):
    """The first line of the file at `path` that starts with `prefix` (or,
    with `anywhere`, holds it), stripped, polling every 0.1 s for up to
    `seconds`; "" once `proc` has ended without one or the time is up."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith(prefix) or (anywhere and prefix in line):
                    return line.strip()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    return ""


def thread_stacks(pid, words=4096, keep=12):
    """Where each thread of a process that did not end waits: its name, kernel
    wait channel and system call, and the libraries of the code addresses
    found on its stack from SP upwards (`words` words; a run of one library
    shown once, `keep` in all), innermost first, as "lib+0xoffset". Read through
    /proc (a child of this process, or root); no debugger on the machine.
    A stack's words are not a backtrace: stale values can show too, but a
    thread blocked inside a library has that library's return addresses
    next to libc's."""
    base = "/proc/%d" % pid
    code = []
    try:
        with open(base + "/maps") as f:
            for l in f:
                cols = l.split()
                if len(cols) >= 6 and "x" in cols[1]:
                    lo, hi = (int(x, 16) for x in cols[0].split("-"))
                    code.append((lo, hi, int(cols[2], 16), os.path.basename(cols[5])))
    except OSError as e:
        return ["maps: %s" % e]

    def name(a):
        for lo, hi, off, lib in code:
            if lo <= a < hi:
                return "%s+0x%x" % (lib, a - lo + off)
        return None

    def read(path):
        try:
            with open(path) as h:
                return h.read().strip()
        except OSError:
            return "?"

    lines = []
    task = base + "/task"
    for t in sorted(os.listdir(task), key=int) if os.path.isdir(task) else []:
        sc = read("%s/%s/syscall" % (task, t))
        line = "thread %s %s wchan=%s syscall=%s" % (t, read("%s/%s/comm" % (task, t)),
                                                   read("%s/%s/wchan" % (task, t)), sc.split(" ")[0])
        cols = sc.split()
        frames = []
        if len(cols) >= 9:
            sp, pc = int(cols[7], 16), int(cols[8], 16)
            frames.append(name(pc) or "0x%x" % pc)
            raw = b""
            try:  # page by page: the stack's top ends the read
                with open(base + "/mem", "rb", buffering=0) as m:
                    a = sp
                    while len(raw) < 8 * words:
                        m.seek(a)
                        chunk = m.read(4096 - a % 4096)
                        if not chunk:
                            break
                        raw, a = raw + chunk, a + len(chunk)
            except (OSError, ValueError, OverflowError) as e:
                if not raw:
                    frames.append("(stack: %s)" % e)
            for i in range(0, len(raw) - 7, 8):
                n = name(int.from_bytes(raw[i:i + 8], "little"))
                if n and (not frames or n.split("+")[0] != frames[-1].split("+")[0]):
                    frames.append(n)
                    if len(frames) >= keep:
                        break
        lines.append(line + " stack: " + " < ".join(frames))
    return lines


# ---------------------------------------------------------------- checks and rows

class Check:
    """One row of the table: each criterion is asserted by a method of this
    object, which records what it asked (the row's `expected`) and what it saw
    (`observed`). Failures are collected; `failures` is empty when all held.
    The suite's conftest fails the test at its end when any did not hold."""

    def __init__(self, title=""):
        self.title = title
        self.expected = []
        self.observed = []
        self.failures = []
        self.notes = []

    def _rec(self, ok, exp, obs):
        self.expected.append(exp)
        self.observed.append(obs + ("" if ok else " ✗"))
        if not ok:
            self.failures.append("%s; saw %s" % (exp, obs))
        return ok

    def note(self, text):
        """Something seen and shown, not judged."""
        if text:
            self.notes.append(str(text))

    def that(self, ok, exp, obs):
        return self._rec(bool(ok), exp, obs)

    def ran(self, r, rc=0):
        """The process ran to its end with exit status RC."""
        return self._rec(r.rc == rc and not r.timed_out, "exit %d" % rc, r.describe() if r.rc is not None else r.note)

    def eq(self, key, got, want, show=str):
        return self._rec(got is not None and str(got) == str(want), "%s = %s" % (key, show(want)),
                         "%s=%s" % (key, show(got) if got not in (None, "") else "none"))

    def ne(self, key, got, bad, show=str):
        return self._rec(got is not None and str(got) != str(bad), "%s != %s" % (key, show(bad)),
                         "%s=%s" % (key, show(got) if got not in (None, "") else "none"))

    def within(self, key, got, lo=None, hi=None, show=str, lo_open=False):
        """lo <= got <= hi (lo < got with lo_open), as whole numbers."""
        n = as_int(got)
        ok = n is not None and (lo is None or (n > lo if lo_open else n >= lo)) and (hi is None or n <= hi)
        if lo is not None and hi is not None and lo == hi and not lo_open:
            exp = "%s = %s" % (key, show(lo))
        elif lo is not None and hi is not None:
            exp = "%s %s %s <= %s" % (show(lo), "<" if lo_open else "<=", key, show(hi))
        elif lo is not None:
            exp = "%s %s %s" % (key, ">" if lo_open else ">=", show(lo))
        else:
            exp = "%s <= %s" % (key, show(hi))
        return self._rec(ok, exp, "%s=%s" % (key, show(got) if n is not None else (got or "none")))

    def at_most(self, key, got, hi, show=lambda x: "%g" % x):
        """A number (float) <= hi."""
        f = as_float(got)
        return self._rec(f is not None and f <= hi, "%s <= %s" % (key, show(hi)),
                         "%s=%s" % (key, show(f) if f is not None else (got or "none")))

    def at_least(self, key, got, lo, show=lambda x: "%g" % x):
        f = as_float(got)
        return self._rec(f is not None and f >= lo, "%s >= %s" % (key, show(lo)),
                         "%s=%s" % (key, show(f) if f is not None else (got or "none")))

    def kv(self, d, key, want, show=str):
        return self.eq(key, d.get(key), want, show)

    def expected_text(self):
        return "; ".join(self.expected)

    def observed_text(self):
        return "; ".join([x for x in self.observed] + self.notes)


def esc(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


class Table:
    """The rows of a run, written as markdown to PATH after every row (so a
    run stopped half way still leaves its table)."""

    def __init__(self, path, header):
        self.path, self.header, self.rows = path, header, []
        self.t0 = time.monotonic()

    def add(self, title, expected, observed, verdict):
        self.rows.append((title, expected, observed, verdict))
        self.write()

    def render(self, finished=False):
        out = [self.header, "", "| check | expected | observed | PASS/FAIL |", "|---|---|---|---|"]
        for t, e, o, v in self.rows:
            out.append("| %s | %s | %s | %s |" % (esc(t), esc(e), esc(o), v))
        n = len(self.rows)
        npass = sum(1 for r in self.rows if r[3] == "PASS")
        out.append("")
        out.append("%d checks, %d passed, %d not passed (%.0fs)%s." % (
            n, npass, n - npass, time.monotonic() - self.t0, "" if finished else ", run still going or stopped"))
        return "\n".join(out) + "\n"

    def write(self, finished=False):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.render(finished))
        os.replace(tmp, self.path)
