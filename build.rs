//! Generate the gRPC service from `proto/conductor.proto` with a pure-Rust protobuf compiler
//! (no `protoc` needed), and write the descriptor set gRPC reflection serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["proto/conductor.proto"], ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("conductor_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
