//! Generates the tonic/prost code from `proto/tessera/v1/*.proto` with the vendored `protoc`, so no system protoc is
//! needed (and `PROTOC` is never set for the rest of the build: raft-proto wants its own protoc 3.x).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos =
        ["proto/tessera/v1/common.proto", "proto/tessera/v1/agent.proto", "proto/tessera/v1/coordinator.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        // Map fields become BTreeMaps: their order reaches logs and reports.
        .btree_map(".")
        .compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
