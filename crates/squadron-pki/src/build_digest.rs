//! The SHA-256 of the running binary: what a node, a worker and the operator's CLI attest in
//! the release evidence (ADR-0011: "immutable build/deploy digest equality"). Read once per
//! process, from `/proc/self/exe` (the file the process was started from, even if a newer
//! build has since replaced the path).

use std::sync::OnceLock;

use sha2::Digest as _;

/// The running binary's SHA-256, hex; the error says why it could not be read.
pub fn own_binary_sha256() -> Result<String, String> {
    static DIGEST: OnceLock<Result<String, String>> = OnceLock::new();
    DIGEST
        .get_or_init(|| {
            let path = std::path::Path::new("/proc/self/exe");
            let mut file =
                std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut hasher = sha2::Sha256::new();
            std::io::copy(&mut file, &mut hasher)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(hex::encode(hasher.finalize()))
        })
        .clone()
}

/// [`own_binary_sha256`] for an async caller that reports it (a node's or a worker's answer
/// to the evidence): hashed off the runtime (a first read reads the whole binary), empty when
/// it could not be read, which fails the "one build" claim by the member's name.
pub async fn own_binary_sha256_or_empty() -> String {
    tokio::task::spawn_blocking(own_binary_sha256)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_the_running_file_s() {
        let digest = own_binary_sha256().unwrap();
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(digest, hex::encode(sha2::Sha256::digest(&bytes)));
        assert_eq!(own_binary_sha256().unwrap(), digest, "read once");
    }
}
