//! The caller's token at rest. A job acts as its author, so the token it will use is kept with
//! the job until the job ends (then cleared). It is sealed with XChaCha20-Poly1305 under a key
//! from configuration (`GANTRY_TOKEN_KEY`), or, for `gantry serve` without one, a key generated
//! into the data dir on first start, readable by its owner only. A database dump therefore holds
//! no usable token.

use std::io::Write;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};

/// Marks a sealed value: version 1, base64 of nonce and ciphertext.
const PREFIX: &str = "enc:v1:";
const NONCE_BYTES: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid token key: give 32 bytes in base64 (for example `openssl rand -base64 32`)")]
    Key,
    #[error("failed to read or create the token key file {path}")]
    KeyFile { path: String, source: std::io::Error },
    #[error("failed to open a sealed token: it was sealed with another key or is damaged")]
    Open,
}

/// A secret setting (a key, a password): its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Secret(text.to_string()))
    }
}

/// Seals and opens tokens. (No `Debug` of the key.)
#[derive(Clone)]
pub struct TokenCipher {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for TokenCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenCipher(..)")
    }
}

impl TokenCipher {
    /// A cipher under the base64 key `text` (32 bytes).
    pub fn from_key_text(text: &str) -> Result<TokenCipher, Error> {
        let bytes = STANDARD.decode(text.trim()).map_err(|_| Error::Key)?;
        if bytes.len() != 32 {
            return Err(Error::Key);
        }
        Ok(TokenCipher { cipher: XChaCha20Poly1305::new(Key::from_slice(&bytes)) })
    }

    /// A cipher under a fresh random key (tests, or a key file being created).
    pub fn generate() -> (TokenCipher, String) {
        let key = XChaCha20Poly1305::generate_key(&mut OsRng);
        (TokenCipher { cipher: XChaCha20Poly1305::new(&key) }, STANDARD.encode(key))
    }

    /// The key in `path`, created (mode 0600, never overwritten) when the file does not exist.
    pub fn load_or_create(path: &Path) -> Result<TokenCipher, Error> {
        let file_error = |source| Error::KeyFile { path: path.display().to_string(), source };
        match std::fs::read_to_string(path) {
            Ok(text) => return TokenCipher::from_key_text(&text),
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(file_error(error)),
            Err(_) => {}
        }
        let (cipher, text) = TokenCipher::generate();
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(path) {
            Ok(mut file) => {
                file.write_all(format!("{text}\n").as_bytes()).map_err(file_error)?;
                Ok(cipher)
            }
            // Another process created it first: use theirs.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                TokenCipher::from_key_text(&std::fs::read_to_string(path).map_err(file_error)?)
            }
            Err(error) => Err(file_error(error)),
        }
    }

    /// The sealed form of `token`, different on every call (random nonce).
    pub fn seal(&self, token: &str) -> String {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self.cipher.encrypt(&nonce, token.as_bytes()).expect("sealing in memory cannot fail");
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        format!("{PREFIX}{}", STANDARD.encode(bytes))
    }

    /// The token of a sealed value. A value without the marker was stored by an earlier version
    /// (before tokens were sealed) and is returned as it is.
    pub fn open(&self, stored: &str) -> Result<String, Error> {
        let Some(encoded) = stored.strip_prefix(PREFIX) else { return Ok(stored.to_string()) };
        let bytes = STANDARD.decode(encoded).map_err(|_| Error::Open)?;
        if bytes.len() < NONCE_BYTES {
            return Err(Error::Open);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_BYTES);
        let plain = self.cipher.decrypt(XNonce::from_slice(nonce), sealed).map_err(|_| Error::Open)?;
        String::from_utf8(plain).map_err(|_| Error::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_token_opens_only_with_its_key() {
        let (cipher, _) = TokenCipher::generate();
        let sealed = cipher.seal("alice-token");
        assert!(sealed.starts_with(PREFIX) && !sealed.contains("alice"), "{sealed}");
        assert_ne!(sealed, cipher.seal("alice-token"), "a fresh nonce every time");
        assert_eq!(cipher.open(&sealed).unwrap(), "alice-token");
        let (other, _) = TokenCipher::generate();
        assert!(matches!(other.open(&sealed), Err(Error::Open)));
        let mut damaged = sealed.clone();
        damaged.pop();
        damaged.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert!(cipher.open(&damaged).is_err());
        assert_eq!(cipher.open("legacy-plain").unwrap(), "legacy-plain");
    }

    #[test]
    fn secrets_are_not_debug_printed() {
        let secret: Secret = "hunter2".parse().unwrap();
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn keys_come_from_base64_or_a_private_file() {
        assert!(matches!(TokenCipher::from_key_text("short"), Err(Error::Key)));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token.key");
        let first = TokenCipher::load_or_create(&path).unwrap();
        let sealed = first.seal("t");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let again = TokenCipher::load_or_create(&path).unwrap();
        assert_eq!(again.open(&sealed).unwrap(), "t", "the same key on the next start");
    }
}
