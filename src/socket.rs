//! The driver's unix sockets: bound only where no live socket is.

use std::path::Path;

use tokio::net::UnixListener;

use crate::error::{Error, Result};

/// Binds `socket`, replacing a stale socket file (one nobody answers on)
/// but nothing else.
pub fn bind(socket: &Path) -> Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) => {
            use std::os::unix::fs::FileTypeExt;
            if !m.file_type().is_socket() {
                return Err(Error::FailedPrecondition(format!(
                    "{} exists and is not a socket; refusing to replace it",
                    socket.display()
                )));
            }
            // A socket someone still answers on is not stale.
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Err(Error::FailedPrecondition(format!(
                    "{} is live: another process serves on it; refusing to replace it",
                    socket.display()
                )));
            }
            std::fs::remove_file(socket)
                .map_err(|e| Error::io(format!("remove stale {}", socket.display()), e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("stat {}", socket.display()), e)),
    }
    UnixListener::bind(socket).map_err(|e| Error::io(format!("bind {}", socket.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_live_socket_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("csi.sock");
        let first = bind(&sock).unwrap();
        let e = bind(&sock).unwrap_err();
        assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
        assert!(sock.exists(), "the live socket stays");
        drop(first);
        // Nobody answers any more: stale, replaced.
        let _second = bind(&sock).unwrap();
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, b"not a socket").unwrap();
        assert!(matches!(bind(&sock), Err(Error::FailedPrecondition(_))));
    }
}
