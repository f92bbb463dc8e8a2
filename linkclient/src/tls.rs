//! The PEM files of an mTLS client, and tonic's configuration from them.

use std::path::{Path, PathBuf};

/// A PEM file that could not be read: its path is in the message, so an
/// operator knows which of the three to fix.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct TlsFileError {
    /// The file.
    pub path: PathBuf,
    /// Why it could not be read.
    pub source: std::io::Error,
}

/// The PEM files of an mTLS link. Kept as paths, not contents: the agent
/// reads them again at every connection, so a renewed certificate is used
/// without a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This client's certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signed the controller's certificate.
    pub ca: PathBuf,
}

/// The three files' contents, as read at one moment.
#[derive(Clone, Debug)]
pub struct TlsPem {
    /// The certificate (chain), PEM.
    pub cert: Vec<u8>,
    /// The private key, PEM.
    pub key: Vec<u8>,
    /// The CA certificate(s), PEM.
    pub ca: Vec<u8>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError {
        path: path.to_path_buf(),
        source,
    })
}

impl TlsFiles {
    /// The files as they are now (the CA first, then the certificate, then
    /// the key: the first unreadable one is the error).
    pub fn read(&self) -> Result<TlsPem, TlsFileError> {
        let ca = read(&self.ca)?;
        let cert = read(&self.cert)?;
        let key = read(&self.key)?;
        Ok(TlsPem { cert, key, ca })
    }

    /// tonic's client configuration, from the files as they are now.
    pub fn client_config(&self) -> Result<tonic::transport::ClientTlsConfig, TlsFileError> {
        let pem = self.read()?;
        Ok(tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem.ca))
            .identity(tonic::transport::Identity::from_pem(pem.cert, pem.key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> TlsFiles {
        TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            ca: dir.join("ca.pem"),
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = files(dir.path());
        std::fs::write(&f.ca, b"ca").expect("write");
        std::fs::write(&f.key, b"key").expect("write");
        let e = f.client_config().expect_err("no cert file");
        assert_eq!(e.path, f.cert);
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}: ", f.cert.display())),
            "{text}"
        );
        assert_eq!(e.source.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn the_ca_is_read_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = files(dir.path()).read().expect_err("nothing there");
        assert_eq!(e.path, dir.path().join("ca.pem"));
    }

    #[test]
    fn contents_are_as_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = files(dir.path());
        std::fs::write(&f.ca, b"the ca").expect("write");
        std::fs::write(&f.cert, b"the cert").expect("write");
        std::fs::write(&f.key, b"the key").expect("write");
        let pem = f.read().expect("readable");
        assert_eq!(
            (pem.ca.as_slice(), pem.cert.as_slice(), pem.key.as_slice()),
            (&b"the ca"[..], &b"the cert"[..], &b"the key"[..])
        );
        f.client_config()
            .expect("a configuration from readable files");
    }
}
