fn main() {
    // The shim's own references to symbols it defines bind inside the
    // library, never to another object's interposed copy.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
