//! Generates the kubelet's device-plugin API (`proto/deviceplugin/v1beta1/api.proto`)
//! and the client of its PodResources API (`proto/podresources/v1/api.proto`)
//! for `vramcap device-plugin`, with the protoc that protoc-bin-vendored
//! ships: no protoc needs to be installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; the variable is for prost-build.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto/deviceplugin/v1beta1/api.proto");
    println!("cargo:rerun-if-changed=proto/podresources/v1/api.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/deviceplugin/v1beta1/api.proto"], &["proto"])?;
    // The kubelet's PodResources API: which devices are still allocated.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_protos(&["proto/podresources/v1/api.proto"], &["proto"])?;
    Ok(())
}
