//! Generate the gRPC service from `proto/conductor.proto` with a pure-Rust protobuf compiler
//! (no `protoc` needed), and write the descriptor set gRPC reflection serves.
//!
//! Two outputs: the messages and client (`gateway::pb`), and the server (`gateway::pb_server`),
//! whose query messages are the hand-written codecs of `gateway::grpc_wire` (same bytes,
//! cheaper to produce) and whose other messages are `gateway::pb`'s.

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
        .build_server(false)
        .compile_fds(fds.clone())?;

    const PACKAGE: &str = ".mooncake.conductor.v1";
    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .out_dir(&server_dir)
        .extern_path(PACKAGE, "crate::gateway::pb")
        .extern_path(
            format!("{PACKAGE}.QueryRequest"),
            "crate::gateway::grpc_wire::QueryRequestIn",
        )
        .extern_path(
            format!("{PACKAGE}.QueryByHashRequest"),
            "crate::gateway::grpc_wire::QueryByHashRequestIn",
        )
        .extern_path(
            format!("{PACKAGE}.QueryResponse"),
            "crate::gateway::grpc_wire::QueryReply",
        )
        .compile_fds(fds)?;
    Ok(())
}
