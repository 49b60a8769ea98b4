//! The one way blocking work leaves the async runtime: mount, umount2
//! (which flushes), statvfs, ioctls, sysfs and mountinfo reads run on
//! tokio's blocking threads, so a slow unmount never stalls other calls
//! (Probe included).
//!
//! Each run has a bound. A syscall cannot be interrupted, so past the bound
//! the caller gets DEADLINE_EXCEEDED and the thread is left to finish on
//! its own; it logs when it does. Every step run here is a single check or
//! change that a retry re-inspects, so nothing is left half-done by that.
//!
//! A step started inside [`keeping`] holds the token it was given (a
//! volume's guard) until the step itself ends: an operation that gave up
//! waiting on a stuck unmount still keeps its volume busy until the
//! unmount returns, so no retry runs beside it.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// What a blocking step keeps alive until it ends.
pub type Token = Arc<dyn Any + Send + Sync>;

tokio::task_local! {
    static KEEP: Token;
}

/// Runs `fut` so that every blocking step it starts (through [`run`])
/// holds `token` until that step ends, even past the step's bound.
pub async fn keeping<F: Future>(token: Token, fut: F) -> F::Output {
    KEEP.scope(token, fut).await
}

/// Runs `f` on a blocking thread; gives up waiting after `bound`.
pub async fn run<T, F>(what: &str, bound: Duration, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let started = Instant::now();
    let label = what.to_string();
    let keep = KEEP.try_with(Token::clone).ok();
    let handle = tokio::task::spawn_blocking(move || {
        let _keep = keep;
        let res = f();
        let took = started.elapsed();
        if took > bound {
            tracing::warn!(
                what = label,
                ?took,
                ok = res.is_ok(),
                "blocking step finished after its caller gave up"
            );
        }
        res
    });
    match tokio::time::timeout(bound, handle).await {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => Err(Error::Internal(format!(
            "{what}: blocking task failed: {e}"
        ))),
        Err(_) => {
            tracing::warn!(what, ?bound, "blocking step still running past its bound");
            Err(Error::Stalled {
                what: what.to_string(),
                after: bound,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_result() {
        let v = run("add", Duration::from_secs(5), || Ok(2 + 2))
            .await
            .unwrap();
        assert_eq!(v, 4);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stuck_step_does_not_stall_the_runtime() {
        let started = Instant::now();
        let slow = run("sleep", Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_millis(600));
            Ok(())
        });
        // On a single-threaded runtime this timer only fires if the
        // blocking step runs elsewhere.
        let (slow, ()) = tokio::join!(slow, tokio::time::sleep(Duration::from_millis(20)));
        assert!(matches!(slow, Err(Error::Stalled { .. })), "{slow:?}");
        assert!(started.elapsed() < Duration::from_millis(500));
        assert_eq!(slow.unwrap_err().code(), tonic::Code::DeadlineExceeded);
    }

    /// A step that outlives its bound keeps the token until it ends.
    #[tokio::test]
    async fn a_stalled_step_keeps_its_token_until_it_ends() {
        let token: Token = Arc::new(());
        let weak = Arc::downgrade(&token);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let res = keeping(
            token,
            run("wait", Duration::from_millis(50), move || {
                let _ = rx.recv();
                Ok(())
            }),
        )
        .await;
        assert!(matches!(res, Err(Error::Stalled { .. })), "{res:?}");
        assert!(weak.upgrade().is_some(), "the stuck step still holds it");
        tx.send(()).unwrap();
        let released = Instant::now();
        while weak.upgrade().is_some() {
            assert!(
                released.elapsed() < Duration::from_secs(10),
                "never released"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
