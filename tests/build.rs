//! Builds the stand-in driver, the stand-in NVML and the C test clients
//! once per change of their sources (not once per test binary or case),
//! into OUT_DIR/standin; the tests find it through `STANDIN_DIR`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("standin");
    for dir in ["standin", "clients"] {
        println!("cargo:rerun-if-changed={}", here.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=CC");
    let status = Command::new("sh")
        .arg(here.join("standin/build.sh"))
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run tests/standin/build.sh: {e}"));
    assert!(
        status.success(),
        "tests/standin/build.sh {} failed ({status}): see the compiler's messages above",
        out.display()
    );
    println!("cargo:rustc-env=STANDIN_DIR={}", out.display());
}
