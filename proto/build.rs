//! Compile the wire protocol with protox (pure Rust), so a fresh machine
//! builds with cargo alone: no system `protoc`. Only with the `wire`
//! feature: without it there is nothing to generate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "wire")]
    {
        use prost::Message as _;
        let fds = protox::compile(["baton/v1/link.proto"], ["proto"])?;
        // The descriptor set, for the controller's gRPC server reflection.
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        std::fs::write(out.join("baton_descriptor.bin"), fds.encode_to_vec())?;
        tonic_prost_build::configure()
            .build_transport(false)
            .compile_fds(fds)?;
        println!("cargo:rerun-if-changed=proto");
    }
    println!("cargo:rerun-if-changed=build.rs");
    Ok(())
}
