fn main() {
    // The shim's own references to symbols it defines bind inside the
    // library, never to another object's interposed copy. zig's linker
    // (cargo zigbuild, used for the old-glibc release build) knows only
    // -Bsymbolic, which does the same for functions and data.
    println!("cargo:rerun-if-env-changed=VRAMCAP_ZIG_LINKER");
    if std::env::var_os("VRAMCAP_ZIG_LINKER").is_some() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    } else {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    }
}
