//! Compiles the sync protocol with a vendored `protoc`, so building needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // A snapshot's body is `Bytes`: decoding takes it out of the received message without
    // a copy. (The server does not send this type: it encodes each snapshot once for every
    // stream, server/src/sync/wire.rs.)
    config.bytes([".levee.sync.v1.Snapshot.body"]);
    println!("cargo:rerun-if-changed=proto/levee/sync/v1/sync.proto");
    tonic_prost_build::configure().build_client(true).build_server(true).compile_with_config(
        config,
        &["proto/levee/sync/v1/sync.proto"],
        &["proto"],
    )?;
    Ok(())
}
