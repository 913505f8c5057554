//! Generates the gRPC client for `proto/conductor.proto` (the one contract shared with the server).
//! protox compiles the descriptors in pure Rust, so building the wheel needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO_DIR: &str = "../proto";
    const PROTO: &str = "../proto/conductor.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let fds = protox::compile([PROTO], [PROTO_DIR])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
