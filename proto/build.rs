//! Compile the wire protocol with protox (pure Rust), so a fresh machine
//! builds with cargo alone: no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["baton/v1/link.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
