//! Certificates for a TLS test server, made by `openssl`: a certificate
//! authority and a server certificate it signs, for `127.0.0.1` and
//! `localhost`, valid two days (and for TLS cluster nodes, which present
//! it to each other as clients too).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::TempDir;

/// The files of a test certificate authority and a server certificate.
#[derive(Debug)]
pub(super) struct Certificates {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// Holds the files; removed last.
    dir: TempDir,
}

impl Certificates {
    /// Makes them in a directory of their own (`NotFound` when `openssl`
    /// is not installed).
    pub(super) fn make() -> io::Result<Certificates> {
        let dir = TempDir::new("tls")?;
        let certs = Certificates {
            ca: dir.path().join("ca.crt"),
            cert: dir.path().join("server.crt"),
            key: dir.path().join("server.key"),
            dir,
        };
        let ext = certs.path("server.ext");
        std::fs::write(
            &ext,
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth,clientAuth\n\
             subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )?;
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        certs.openssl(|c| {
            c.args(["req", "-x509", "-nodes", "-days", "2"])
                .args(ec)
                .args(["-subj", "/CN=tollgate test CA"])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
                .arg("-keyout")
                .arg(certs.path("ca.key"))
                .arg("-out")
                .arg(certs.ca_file())
        })?;
        certs.openssl(|c| {
            c.args(["req", "-nodes"])
                .args(ec)
                .args(["-subj", "/CN=localhost"])
                .arg("-keyout")
                .arg(certs.server_key())
                .arg("-out")
                .arg(certs.path("server.csr"))
        })?;
        certs.openssl(|c| {
            c.args(["x509", "-req", "-days", "2", "-set_serial", "2"])
                .arg("-in")
                .arg(certs.path("server.csr"))
                .arg("-CA")
                .arg(certs.ca_file())
                .arg("-CAkey")
                .arg(certs.path("ca.key"))
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(certs.server_cert())
        })?;
        Ok(certs)
    }

    /// Runs `openssl` with the arguments `args` adds.
    fn openssl(&self, args: impl FnOnce(&mut Command) -> &mut Command) -> io::Result<()> {
        let mut cmd = Command::new("openssl");
        args(&mut cmd);
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("openssl: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "openssl failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The certificate authority's certificate (PEM).
    pub(super) fn ca_file(&self) -> &Path {
        &self.ca
    }

    /// The server's certificate (PEM).
    pub(super) fn server_cert(&self) -> &Path {
        &self.cert
    }

    /// The server's private key (PEM).
    pub(super) fn server_key(&self) -> &Path {
        &self.key
    }
}
