//! A private CA for the TLS tests, made with the `openssl` command (`tests/run.sh` installs it
//! when missing): a CA, a server certificate it signs for IP 127.0.0.1 and DNS localhost, and
//! a client certificate it signs, and a server certificate it signs for another name only. Each [`Pki`] is its own CA, in its own temporary directory,
//! removed when dropped.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A CA and the certificates it signed, as PEM files.
pub struct Pki {
    dir: PathBuf,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A new P-256 key, unencrypted.
const KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";

impl Pki {
    /// A new CA (P-256 keys, valid for a day) with `server.pem` / `server.key`,
    /// `stranger.pem` / `stranger.key` (for `elsewhere.invalid` only) and `client.pem` /
    /// `client.key` signed by it.
    pub fn new() -> Self {
        let (pid, n) = (std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let dir = std::env::temp_dir().join(format!("mrtr-pki-{pid}-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Self { dir };
        // Each CA its own name: a certificate another one signed has an unknown issuer.
        pki.openssl(&format!(
            "req -x509 {KEY} -keyout ca.key -out ca.pem -days 1 -subj /CN=mrtr-test-CA-{pid}-{n}"
        ));
        pki.sign(
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        pki.sign(
            "stranger",
            "subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n",
        );
        pki.sign("client", "extendedKeyUsage=clientAuth\n");
        pki
    }

    /// `name`'s file in the directory (`ca.pem`, `server.key`, ...).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    // A key `name.key` and its certificate `name.pem`, signed by the CA with `extensions`.
    fn sign(&self, name: &str, extensions: &str) {
        let ext = format!("{name}.ext");
        std::fs::write(
            self.file(&ext),
            format!("basicConstraints=CA:FALSE\n{extensions}"),
        )
        .unwrap();
        self.openssl(&format!(
            "req {KEY} -keyout {name}.key -out {name}.csr -subj /CN={name}"
        ));
        self.openssl(&format!(
            "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out {name}.pem \
             -days 1 -extfile {ext}"
        ));
    }

    // `openssl` with `args` (split at spaces: no argument has one).
    fn openssl(&self, args: &str) {
        let out = Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(&self.dir)
            .output()
            .expect("openssl is installed (tests/run.sh installs it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
