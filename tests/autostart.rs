//! Python without a launcher (issue 35): the wheel's start hook
//! (`vramcap_autostart.pth`), `vramcap.set_limit` restarting a script,
//! `vramcap.torch` without PyTorch, and `vramcap kernel`'s kernelspecs.
//!
//! The package goes into a virtual environment made here as the wheel lays
//! it out (site-packages/vramcap/ with the shim, the .pth beside it), so
//! the hook runs at a real interpreter start. scripts/check-package.sh does
//! the same with the built wheel, and scripts/check-jupyter.py starts a
//! kernel from `vramcap kernel install` with jupyter_client.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::util::*;

/// venv/bin/python and its site-packages, with the package, the shim and
/// the start hook installed as the wheel installs them.
struct Venv {
    python: PathBuf,
    site: PathBuf,
}

fn venv() -> &'static Venv {
    static V: OnceLock<Venv> = OnceLock::new();
    V.get_or_init(|| {
        let dir = fresh_dir("python-venv");
        let out = Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&dir)
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "python3 -m venv: {out:?}");
        let lib = dir.join("lib");
        let py = std::fs::read_dir(&lib)
            .expect("venv/lib")
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .expect("venv/lib/python3.X")
            .path();
        let site = py.join("site-packages");
        let pkg = site.join("vramcap");
        std::fs::create_dir_all(&pkg).expect("package dir");
        let src = root().join("python");
        for e in std::fs::read_dir(src.join("vramcap"))
            .expect("python/vramcap")
            .flatten()
        {
            let name = e.file_name();
            if name.to_string_lossy().ends_with(".py") {
                std::fs::copy(e.path(), pkg.join(&name)).expect("copy module");
            }
        }
        std::fs::copy(&artefacts().shim, pkg.join("libvramcap.so")).expect("copy shim");
        std::fs::copy(
            src.join("vramcap_autostart.pth"),
            site.join("vramcap_autostart.pth"),
        )
        .expect("copy .pth");
        Venv {
            python: dir.join("bin/python"),
            site,
        }
    })
}

/// The venv's python in a bare environment whose PATH is only the venv's
/// bin (no `vramcap` command there: messages name `python -m vramcap`),
/// the shim's warnings off.
fn python() -> Command {
    let v = venv();
    let mut cmd = bare(&v.python);
    cmd.env("PATH", v.python.parent().expect("venv/bin"))
        .env("VRAMCAP_LOG", "error");
    cmd
}

/// Runs `cmd` with `input` on stdin: its PID and what it did.
fn run_fed(mut cmd: Command, input: &str) -> (u32, Ran) {
    let what = format!("{cmd:?}");
    let mut child = spawn_piped(&mut cmd);
    let pid = child.id();
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (pid, Ran { what, out })
}

/// Opens device 0 on the driver and allocates 256 MiB blocks, up to 16 (4
/// GiB of the stand-in's 16): how many it got and the last result.
/// (tests/clients/alloc_256m.py, which scripts/check-package.sh runs too.)
const ALLOC: &str = concat!("\n", include_str!("clients/alloc_256m.py"));

/// What the process is: PID, argv, the interpreter, stdin, under the shim.
const WHO: &str = r#"
import os, sys, vramcap
print("pid", os.getpid())
print("argv", sys.argv, sys.orig_argv[1] == "-c", sys.executable)
print("stdin", sys.stdin.read().strip())
print("active", vramcap.is_active(), os.environ.get("LD_PRELOAD", "").count("libvramcap.so"))
"#;

/// What [`WHO`] prints in the process `pid`, run as `python -c WHO ARGS…`
/// (`argv`: the list Python shows) by `python`, fed `stdin`, under the shim.
fn who_under_the_shim(pid: u32, argv: &str, python: &Path, stdin: &str) -> Vec<String> {
    vec![
        format!("pid {pid}"),
        format!("argv {argv} True {}", python.display()),
        format!("stdin {stdin}"),
        "active True 1".to_string(),
    ]
}

/// `VRAMCAP_LIMIT=1GiB python -c …`: the program runs once, under the
/// shim, capped, with its PID, command line, interpreter and stdin.
#[test]
fn the_environment_variable_alone_caps_python() {
    let v = venv();
    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .args(["-c", &format!("{WHO}{ALLOC}"), "one", "two"]);
    let (pid, ran) = run_fed(cmd, "fed on stdin\n");
    let mut want = who_under_the_shim(pid, "['-c', 'one', 'two']", &v.python, "fed on stdin");
    want.push("allocs 4 rc 2".into());
    ran.expect_owned_lines(&want);
    assert_eq!(ran.stderr(), "", "stderr{}", ran.stderr());

    // VRAMCAP_GROUP alone starts it under the shim too.
    let mut cmd = python();
    cmd.env("VRAMCAP_GROUP", "py-autostart").args(["-c", WHO]);
    let (pid, ran) = run_fed(cmd, "");
    ran.expect_owned_lines(&who_under_the_shim(pid, "['-c']", &v.python, ""));
}

/// Without a vramcap variable the hook does nothing: not under the shim,
/// not capped.
#[test]
fn without_a_variable_python_is_left_alone() {
    let mut cmd = python();
    cmd.args(["-c", &format!("{WHO}{ALLOC}")]);
    let (pid, ran) = run_fed(cmd, "");
    let lines = ran.ok_lines();
    assert_eq!(lines[0], format!("pid {pid}"));
    assert_eq!(lines[3..], ["active False 0", "allocs 16 rc 0"]);
}

/// A process that has the shim by another name (as /etc/ld.so.preload of
/// the device plugin gives it) is not restarted with a second copy.
#[test]
fn a_shim_loaded_another_way_is_not_loaded_again() {
    let dir = fresh_dir("python-other-preload");
    let link = dir.join("preloaded.so");
    std::os::unix::fs::symlink(&artefacts().shim, &link).expect("symlink");
    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .env("LD_PRELOAD", &link)
        .args([
            "-c",
            &format!("import os; print(os.environ['LD_PRELOAD']){ALLOC}"),
        ]);
    run(cmd).expect_lines(&[&link.display().to_string(), "allocs 4 rc 2"]);
}

/// A process restarted once whose shim did not load (LD_PRELOAD dropped)
/// says so and goes on: no second restart, no loop.
#[test]
fn a_restart_that_lost_the_shim_is_not_tried_again() {
    let v = venv();
    let code = format!(
        "import os, sys; sys.path.insert(0, {:?}); os.environ['_VRAMCAP_AUTOSTART'] = str(os.getpid()); \
         import vramcap._autostart as a; a.autostart(); print('went on', os.getpid())",
        v.site.display().to_string()
    );
    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "1GiB").args(["-S", "-c", &code]);
    let (pid, ran) = run_fed(cmd, "");
    ran.expect_lines(&[&format!("went on {pid}")]);
    assert_eq!(
        ran.stderr(),
        "vramcap: VRAMCAP_LIMIT is set and this interpreter was restarted under libvramcap.so, but it is not loaded (LD_PRELOAD dropped?): running without the cap\n"
    );
}

/// The first lines `import vramcap; vramcap.set_limit(0, "2GiB")` of a
/// script started with plain python: one line on stderr, then the script
/// again under the shim, capped at 2 GiB, same PID and arguments.
#[test]
fn set_limit_at_the_top_of_a_script_restarts_it_capped() {
    let dir = fresh_dir("python-set-limit");
    let script = dir.join("train.py");
    std::fs::write(
        &script,
        format!(
            "import vramcap; vramcap.set_limit(0, \"2GiB\")\nimport os, sys\nprint('pid', os.getpid(), sys.argv[1:]){ALLOC}print('limit', vramcap.get_limit(0))\n"
        ),
    )
    .expect("write script");
    let mut cmd = python();
    cmd.arg(&script).arg("--epochs=1");
    let (pid, ran) = run_fed(cmd, "");
    ran.expect_lines(&[
        &format!("pid {pid} ['--epochs=1']"),
        "allocs 8 rc 2",
        "limit 2147483648",
    ]);
    assert_eq!(
        ran.stderr(),
        "vramcap: set_limit(0, '2GiB'): restarting this program under libvramcap.so with VRAMCAP_LIMIT=0=2GiB\n"
    );

    // Under the shim already (VRAMCAP_LIMIT=4GiB), before any CUDA call:
    // lowered in place, no restart.
    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "4GiB").arg(&script);
    let (pid, ran) = run_fed(cmd, "");
    ran.expect_lines(&[
        &format!("pid {pid} []"),
        "allocs 8 rc 2",
        "limit 2147483648",
    ]);
    assert_eq!(ran.stderr(), "");
}

/// Where a restart would lose state, NotActive says the command to use.
#[test]
fn set_limit_where_a_restart_loses_state_names_the_command() {
    let v = venv();
    let py = v.python.display().to_string();
    let dir = fresh_dir("python-not-active");
    let script = dir.join("train.py");
    let call = "import vramcap\ntry:\n    vramcap.set_limit(0, '2GiB')\nexcept vramcap.NotActive as e:\n    print('NotActive:', e)\n";
    std::fs::write(&script, call).expect("write script");
    let s = script.display().to_string();

    // python -i
    let mut cmd = python();
    cmd.arg("-i").arg(&script);
    let (_, ran) = run_fed(cmd, "");
    ran.expect_lines(&[&format!(
        "NotActive: set_limit(0, '2GiB'): libvramcap.so is not loaded and an interactive session cannot restart without losing its state; start it as: {py} -m vramcap run --limit 0=2GiB -- {py} -i {s}"
    )]);

    // CUDA initialised first
    let cuda = dir.join("after-cuda.py");
    std::fs::write(
        &cuda,
        format!(
            "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)\n{}",
            call.replace("'2GiB'", "2 << 30")
        ),
    )
    .expect("write script");
    let mut cmd = python();
    cmd.arg(&cuda);
    let (_, ran) = run_fed(cmd, "");
    ran.expect_lines(&[&format!(
        "NotActive: set_limit(0, 2147483648): libvramcap.so is not loaded and CUDA is initialised in this process already, and the shim must be there first; start it as: {py} -m vramcap run --limit 0=2147483648 -- {py} {}",
        cuda.display()
    )]);

    // a notebook kernel
    let mut cmd = python();
    cmd.args([
        "-c",
        &format!("import sys; sys.modules['ipykernel'] = type(sys)('ipykernel')\n{call}"),
    ]);
    let (_, ran) = run_fed(cmd, "");
    ran.expect_lines(&[&format!(
        "NotActive: set_limit(0, '2GiB'): libvramcap.so is not loaded and a notebook kernel cannot restart itself without losing its state; install a capped kernel with `{py} -m vramcap kernel install --limit 0=2GiB` and switch this notebook to it"
    )]);

    // the program on stdin
    let mut cmd = python();
    cmd.arg("-");
    let (_, ran) = run_fed(cmd, call);
    ran.expect_lines(&[&format!(
        "NotActive: set_limit(0, '2GiB'): libvramcap.so is not loaded and the program came from standard input, which a restart cannot read again; start it as: {py} -m vramcap run --limit 0=2GiB -- {py} -"
    )]);

    // a bad size is told before any restart
    let mut cmd = python();
    cmd.args(["-c", "import vramcap; vramcap.set_limit(0, '2 Gibs')"]);
    let (_, ran) = run_fed(cmd, "");
    assert_eq!(ran.code(), Some(1));
    assert!(
        ran.stderr()
            .ends_with("ValueError: '2 Gibs' is not a valid amount: unknown unit 'Gibs' (use B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB; all are powers of 1024); e.g. '2GiB', '512MiB' or '50%'\n"),
        "{}",
        ran.stderr()
    );
}

/// vramcap.torch imports without PyTorch and answers in
/// torch.cuda.memory_stats's shape from vramcap's counters.
#[test]
fn vramcap_torch_answers_in_pytorchs_shape_without_pytorch() {
    let code = r#"
import sys
import vramcap.torch as vt
print("torch imported", "torch" in sys.modules)
vt.set_limit("cuda:0", 2 * 1024**3)
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
p, ptrs = ctypes.c_uint64(), []
for i in range(3):
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(256 << 20)) == 0
    ptrs.append(p.value)
assert cu.cuMemFree_v2(ctypes.c_uint64(ptrs[0])) == 0
for k, v in vt.memory_stats(0).items():
    print(k, v)
print(vt.mem_get_info(), vt.memory_reserved(), vt.memory_allocated(), vt.max_memory_reserved())
vt.set_per_process_memory_fraction(0.0625, 0)
print(vt.get_limit(), vt.empty_cache(), vt.memory_reserved("cuda"))
try:
    vt.set_limit("cpu", 1 << 30)
except ValueError as e:
    print(e)
"#;
    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "4GiB").args(["-c", code]);
    let (_, ran) = run_fed(cmd, "");
    ran.expect_lines(&[
        "torch imported False",
        "allocated_bytes.all.current 536870912",
        "num_ooms 0",
        "reserved_bytes.all.current 805306368",
        "reserved_bytes.all.peak 805306368",
        "vramcap.cached 268435456",
        "vramcap.context 0",
        "vramcap.graphs 0",
        "vramcap.limit 2147483648",
        "vramcap.own_limit 2147483648",
        "vramcap.pools 0",
        "vramcap.soft_limit None",
        "vramcap.spilled 0",
        "vramcap.total 17179869184",
        "(1342177280, 2147483648) 805306368 536870912 805306368",
        "1073741824 268435456 536870912",
        "device 'cpu': a CUDA device, e.g. 0, 'cuda:0' or torch.device('cuda', 0)",
    ]);
}

/// A fake interpreter for `vramcap kernel install`: answers the ipykernel
/// check with `prefix` as its sys.prefix.
fn fake_python(dir: &Path, prefix: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("python");
    std::fs::write(&p, format!("#!/bin/sh\necho {}\n", prefix.display())).expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

fn kernel_cmd(data: &Path) -> Command {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("JUPYTER_DATA_DIR", data)
        .env_remove("JUPYTER_PATH")
        .arg("kernel");
    cmd
}

/// install writes a kernelspec that runs the kernel under `vramcap run`;
/// list shows it; remove takes away only what vramcap wrote; bad input is
/// one line with an example.
#[test]
fn kernel_install_list_and_remove() {
    let dir = fresh_dir("python-kernel");
    let data = dir.join("data");
    let env = dir.join("env");
    let py = fake_python(&dir, &env);
    let cli = artefacts().cli.canonicalize().expect("cli path");

    let mut cmd = kernel_cmd(&data);
    cmd.args(["install", "--limit", "8GiB", "--python"])
        .arg(&py);
    let k8 = data.join("kernels/vramcap-8gib");
    run(cmd).expect_lines(&[&format!(
        "installed kernel vramcap-8gib (Python 3 (vramcap 8 GiB)) in {}",
        k8.display()
    )]);
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(k8.join("kernel.json")).expect("read"))
            .expect("json");
    assert_eq!(
        spec,
        serde_json::json!({
            "argv": [cli.display().to_string(), "run", "--limit=8GiB", "--",
                     py.display().to_string(), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (vramcap 8 GiB)",
            "language": "python",
            "interrupt_mode": "signal",
            "metadata": {"debugger": true, "vramcap": {"limit": "8GiB"}},
        })
    );

    // --sys-prefix: the interpreter's prefix; --name; a group.
    let mut cmd = kernel_cmd(&data);
    cmd.args([
        "install",
        "--limit",
        "50%",
        "--group",
        "lab",
        "--name",
        "Lab",
        "--sys-prefix",
        "--python",
    ])
    .arg(&py);
    let lab = env.join("share/jupyter/kernels/lab");
    run(cmd).expect_lines(&[&format!(
        "installed kernel lab (Python 3 (vramcap 50%, group lab)) in {}",
        lab.display()
    )]);

    let mut cmd = kernel_cmd(&data);
    cmd.args(["list", "--prefix"]).arg(&env);
    run(cmd).expect_lines(&[
        &format!(
            "vramcap-8gib  Python 3 (vramcap 8 GiB)           {}",
            k8.display()
        ),
        &format!(
            "lab           Python 3 (vramcap 50%, group lab)  {}",
            lab.display()
        ),
    ]);

    // A kernel vramcap did not write is neither replaced nor removed.
    let theirs = data.join("kernels/python3");
    std::fs::create_dir_all(&theirs).expect("mkdir");
    std::fs::write(
        theirs.join("kernel.json"),
        r#"{"argv": [], "display_name": "Python 3"}"#,
    )
    .expect("write");
    let mut cmd = kernel_cmd(&data);
    cmd.args(["remove", "python3"]);
    let ran = run(cmd);
    ran.expect_code(2);
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: the kernel python3 at {} was not written by vramcap; remove it with jupyter: jupyter kernelspec remove python3\n",
            theirs.display()
        )
    );
    let mut cmd = kernel_cmd(&data);
    cmd.args([
        "install", "--limit", "1GiB", "--name", "python3", "--python",
    ])
    .arg(&py);
    let ran = run(cmd);
    ran.expect_code(2);
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: a kernel named python3 is at {} and was not written by vramcap; pick another name, e.g. --name vramcap-1gib\n",
            theirs.display()
        )
    );

    let mut cmd = kernel_cmd(&data);
    cmd.args(["remove", "vramcap-8gib"]);
    run(cmd).expect_lines(&[&format!(
        "removed kernel vramcap-8gib from {}",
        k8.display()
    )]);
    assert!(!k8.exists());
    assert!(theirs.join("kernel.json").exists());

    let bad: [(&[&str], String); 4] = [
        (
            &["install", "--python", "/bin/true"],
            "vramcap: kernel install needs the cap: --limit (or --group), e.g. vramcap kernel install --limit 8GiB\n".into(),
        ),
        (
            &["install", "--limit", "8GiB", "--name", "my kernel", "--python", "/bin/true"],
            "vramcap: kernel name \"my kernel\": a kernelspec name has only letters, digits, '.', '_' and '-', e.g. --name vramcap-8gib\n".into(),
        ),
        (
            &["install", "--limit", "8GiB", "--python", "/nonexistent/python"],
            "vramcap: --python /nonexistent/python: no such program; give the interpreter that has ipykernel, e.g. --python /opt/venv/bin/python\n".into(),
        ),
        (
            &["remove", "vramcap-8gib"],
            "vramcap: no kernel named \"vramcap-8gib\"; `vramcap kernel list` shows the ones vramcap wrote, e.g. vramcap kernel remove vramcap-8gib\n".into(),
        ),
    ];
    for (args, want) in bad {
        let mut cmd = kernel_cmd(&data);
        cmd.args(args);
        let ran = run(cmd);
        ran.expect_code(2);
        assert_eq!(ran.stderr(), want, "{args:?}");
    }
    // An interpreter without ipykernel.
    let mut cmd = kernel_cmd(&data);
    cmd.args(["install", "--limit", "8GiB", "--python"])
        .arg(&venv().python);
    let ran = run(cmd);
    ran.expect_code(2);
    let py = venv().python.display().to_string();
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: {py} cannot import ipykernel (ModuleNotFoundError: No module named 'ipykernel'); install it there ({py} -m pip install ipykernel) or name another interpreter, e.g. --python /opt/venv/bin/python\n"
        )
    );
}

/// `VRAMCAP_LIMIT=""` (or only white space) is refused before the program
/// runs, with the line the shim gives (without its `[PID]`) and its exit
/// status 2: not run uncapped without a word.
#[test]
fn an_empty_limit_is_refused_as_the_shim_refuses_it() {
    for value in ["", " \t"] {
        let shim = client("procaddr", &[("VRAMCAP_LIMIT", value)], &["init"]);
        shim.expect_code(2);
        let shim_line = shim.stderr();
        let (_, shim_text) = shim_line.split_once("]: ").expect("vramcap[PID]: …");

        let mut cmd = python();
        cmd.env("VRAMCAP_LIMIT", value)
            .args(["-c", "print('the program ran')"]);
        let (_, ran) = run_fed(cmd, "");
        ran.expect_code(2);
        assert_eq!(ran.stdout(), "", "the program must not run");
        let shown = value.escape_debug();
        assert_eq!(
            ran.stderr(),
            format!(
                "vramcap: VRAMCAP_LIMIT=\"{shown}\" is not a valid limit: the value is empty (unset the variable to run without a cap); expected a size or percentage per GPU, e.g. 8GiB, 50%, 0=8GiB,1=4GiB or 4GiB,GPU-5ca1ab1e=2GiB\n"
            )
        );
        assert_eq!(ran.stderr(), format!("vramcap: {shim_text}"), "{value:?}");
    }
}

/// `LD_PRELOAD` naming a `libvramcap.so` that is not there does not count
/// as the shim: one line says so, and the program runs under the
/// package's, capped, with the missing one left out of `LD_PRELOAD`.
#[test]
fn a_missing_shim_in_ld_preload_is_replaced_by_the_packages() {
    let v = venv();
    let pkg_shim = v.site.join("vramcap/libvramcap.so");
    let missing = fresh_dir("python-missing-preload").join("libvramcap.so");
    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .env("LD_PRELOAD", &missing)
        .args([
            "-c",
            &format!(
                "import os, vramcap; print(os.environ['LD_PRELOAD'], vramcap.is_active()){ALLOC}"
            ),
        ]);
    let (_, ran) = run_fed(cmd, "");
    ran.expect_lines(&[&format!("{} True", pkg_shim.display()), "allocs 4 rc 2"]);
    // The loader's own line about the missing file comes first.
    let err = ran.stderr();
    let last = err.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "vramcap: VRAMCAP_LIMIT is set and LD_PRELOAD names {}, which is not there: restarting this interpreter under {}",
            missing.display(),
            pkg_shim.display()
        ),
        "{err}"
    );
    assert_eq!(err.matches("vramcap:").count(), 1, "{err}");

    // Nor is a name that only contains libvramcap.so.
    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .env("LD_PRELOAD", "/nonexistent/libvramcap.so.bak")
        .args([
            "-c",
            &format!("import vramcap; print(vramcap.is_active()){ALLOC}"),
        ]);
    let (_, ran) = run_fed(cmd, "");
    ran.expect_lines(&["True", "allocs 4 rc 2"]);
}

/// `NVIDIA_GPU_MEMORY_LIMIT` (MiB, as NVIDIA's container toolkit sets it)
/// alone starts the shim, which caps by it.
#[test]
fn nvidia_gpu_memory_limit_alone_caps_python() {
    let v = venv();
    let mut cmd = python();
    cmd.env("NVIDIA_GPU_MEMORY_LIMIT", "1024")
        .args(["-c", &format!("{WHO}{ALLOC}")]);
    let (pid, ran) = run_fed(cmd, "");
    let mut want = who_under_the_shim(pid, "['-c']", &v.python, "");
    want.push("allocs 4 rc 2".into());
    ran.expect_owned_lines(&want);
    assert_eq!(ran.stderr(), "");
}

/// `set_limit(0, '12.5%')` at the top of a script restarts it capped at
/// 12.5% of the device (2 GiB of the stand-in's 16), and the restarted
/// script goes on; under the shim already, it sets the cap in place.
#[test]
fn set_limit_of_a_percentage_at_the_top_of_a_script() {
    let dir = fresh_dir("python-set-limit-percent");
    let script = dir.join("train.py");
    std::fs::write(
        &script,
        format!(
            "import vramcap; vramcap.set_limit(0, '12.5%')\nimport os\nprint('pid', os.getpid()){ALLOC}print('limit', vramcap.get_limit(0))\n"
        ),
    )
    .expect("write script");
    let mut cmd = python();
    cmd.arg(&script);
    let (pid, ran) = run_fed(cmd, "");
    ran.expect_lines(&[&format!("pid {pid}"), "allocs 8 rc 2", "limit 2147483648"]);
    assert_eq!(
        ran.stderr(),
        "vramcap: set_limit(0, '12.5%'): restarting this program under libvramcap.so with VRAMCAP_LIMIT=0=12.5%\n"
    );

    let mut cmd = python();
    cmd.env("VRAMCAP_LIMIT", "4GiB").arg(&script);
    let (pid, ran) = run_fed(cmd, "");
    ran.expect_lines(&[&format!("pid {pid}"), "allocs 8 rc 2", "limit 2147483648"]);
    assert_eq!(ran.stderr(), "");
}

/// With `VRAMCAP_DISABLE=1` inherited, `set_limit` says that is why it
/// cannot cap, before any restart (not "LD_PRELOAD dropped?").
#[test]
fn set_limit_under_vramcap_disable_names_the_switch() {
    let dir = fresh_dir("python-set-limit-disabled");
    let script = dir.join("train.py");
    std::fs::write(
        &script,
        "import vramcap\ntry:\n    vramcap.set_limit(0, '2GiB')\nexcept vramcap.NotActive as e:\n    print('NotActive:', e)\n",
    )
    .expect("write script");
    let py = venv().python.display().to_string();
    let want = format!(
        "NotActive: set_limit(0, '2GiB'): VRAMCAP_DISABLE=1 in the environment turns vramcap off in this process, so it cannot be capped; unset VRAMCAP_DISABLE to cap it, e.g. env -u VRAMCAP_DISABLE {py} {}",
        script.display()
    );
    // Without the shim, and under it (switched off).
    for shim in [false, true] {
        let mut cmd = python();
        cmd.env("VRAMCAP_DISABLE", "1").arg(&script);
        if shim {
            cmd.env("LD_PRELOAD", &artefacts().shim);
        }
        let (_, ran) = run_fed(cmd, "");
        ran.expect_lines(&[&want]);
        assert_eq!(ran.stderr(), "", "shim {shim}");
    }
}

/// `kernel install` writes only into a folder of its own in `kernels/`,
/// replaces only a kernel.json it can read as its own, never writes
/// through a link; `kernel list` and `install` print names, display names
/// and folders with their control characters escaped.
#[test]
fn kernel_install_refuses_what_it_cannot_own() {
    let dir = fresh_dir("python-kernel-refusals");
    let data = dir.join("data");
    let kernels = data.join("kernels");
    let py = fake_python(&dir, &dir.join("env"));
    std::fs::create_dir_all(&kernels).expect("mkdir");
    let install = |name: &str| {
        let mut cmd = kernel_cmd(&data);
        cmd.args(["install", "--limit", "1GiB", "--name", name, "--python"])
            .arg(&py);
        run(cmd)
    };

    // `.` and `..` are not folders of their own: kernels/ itself, data/.
    for name in [".", ".."] {
        let ran = install(name);
        ran.expect_code(2);
        assert_eq!(
            ran.stderr(),
            format!(
                "vramcap: kernel name \"{name}\": a kernelspec name is a folder of its own in kernels/, not \".\" or \"..\", e.g. --name vramcap-1gib\n"
            )
        );
    }
    assert!(!kernels.join("kernel.json").exists());
    assert!(!data.join("kernel.json").exists());

    // A kernel.json that is not JSON is not known to be vramcap's.
    let broken = kernels.join("broken");
    std::fs::create_dir_all(&broken).expect("mkdir");
    std::fs::write(broken.join("kernel.json"), "{not json").expect("write");
    let ran = install("broken");
    ran.expect_code(2);
    let why = serde_json::from_str::<serde_json::Value>("{not json")
        .expect_err("not JSON")
        .to_string();
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: a kernel named broken is at {} and its kernel.json is not valid JSON ({why}), so it is not known to be vramcap's; pick another name, e.g. --name vramcap-1gib\n",
            broken.display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(broken.join("kernel.json")).expect("read"),
        "{not json"
    );

    // A kernel.json that is a link (even to a spec of vramcap's) is not
    // written through.
    let target = dir.join("elsewhere.json");
    let ours = r#"{"argv": [], "display_name": "x", "metadata": {"vramcap": {}}}"#;
    std::fs::write(&target, ours).expect("write");
    let linked = kernels.join("linked");
    std::fs::create_dir_all(&linked).expect("mkdir");
    std::os::unix::fs::symlink(&target, linked.join("kernel.json")).expect("symlink");
    let ran = install("linked");
    ran.expect_code(2);
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: a kernel named linked is at {} and its kernel.json is a symbolic link, which vramcap does not write through; pick another name, e.g. --name vramcap-1gib\n",
            linked.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&target).expect("read"), ours);

    // Control characters in a display name and a folder name.
    let mut cmd = kernel_cmd(&data);
    cmd.args([
        "install",
        "--limit",
        "1GiB",
        "--name",
        "evil",
        "--display-name",
        "Evil\x1b[2J\x07",
        "--python",
    ])
    .arg(&py);
    let evil = kernels.join("evil");
    run(cmd).expect_lines(&[&format!(
        "installed kernel evil (Evil\\x1b[2J\\x07) in {}",
        evil.display()
    )]);
    let ctl = kernels.join("ctl\x1bname");
    std::fs::create_dir_all(&ctl).expect("mkdir");
    std::fs::write(
        ctl.join("kernel.json"),
        r#"{"argv": [], "display_name": "Ctl", "metadata": {"vramcap": {}}}"#,
    )
    .expect("write");
    std::fs::remove_dir_all(&linked).expect("rm");
    let mut cmd = kernel_cmd(&data);
    cmd.arg("list");
    let k = kernels.display();
    // Columns as wide as the escaped text: `ctl\x1bname` is 11 characters,
    // `Evil\x1b[2J\x07` 15.
    run(cmd).expect_lines(&[
        &format!("{:11}  {:15}  {k}/ctl\\x1bname", "ctl\\x1bname", "Ctl"),
        &format!("{:11}  {:15}  {k}/evil", "evil", "Evil\\x1b[2J\\x07"),
    ]);
}
