//! The PEM files of an mTLS link, on their own: the agent's configuration
//! names them without importing the link itself.

/// The PEM files of an mTLS link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This agent's certificate.
    pub cert: std::path::PathBuf,
    /// Its private key.
    pub key: std::path::PathBuf,
    /// The CA that signed the controller's certificate.
    pub ca: std::path::PathBuf,
}

impl TlsFiles {
    /// tonic's client configuration, from the files as they are now.
    pub fn client_config(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        let read =
            |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        Ok(tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&self.ca)?))
            .identity(tonic::transport::Identity::from_pem(
                read(&self.cert)?,
                read(&self.key)?,
            )))
    }
}
