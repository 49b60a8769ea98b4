//! The one place every gRPC call is logged and counted: a tower layer on
//! both tonic servers. Each call ends in exactly one log line (service,
//! method, volume or snapshot id when the request has one, gRPC code,
//! duration, and the error message when it failed): INFO for a success or
//! a cancellation by the caller, WARN for any other failure ([`level`]);
//! and one [`Metrics::rpc`] record.
//!
//! The layer sees HTTP, not request messages: the ids come from
//! `validate`, which notes the id it checks ([`note_volume_id`],
//! [`note_snapshot_id`]) in a task-local slot this layer opens per call.
//! Requests themselves are never logged, so their `secrets` never are.
//!
//! The code is read from the response headers (an error answered at once)
//! or from the trailers at the end of the body (a success, or a stream
//! that failed later); a call whose future or body is dropped first was
//! cancelled by its client (or its deadline passed).
//!
//! It also gives tonic's answer to a method no service serves (a bare
//! UNIMPLEMENTED with no message) the message CSI's Error Scheme asks for:
//! which method, and that the driver does not advertise it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tonic::{Code, Status};

use crate::metrics::{code_name, Metrics};

tokio::task_local! {
    static IDS: Arc<Mutex<Ids>>;
}

/// The ids a call's request named, as validation met them.
#[derive(Debug, Default, Clone)]
struct Ids {
    volume: Option<String>,
    snapshot: Option<String>,
}

/// Notes the volume id of the request being served (the first one wins:
/// a group's first member stands for the group). No-op outside a call.
pub fn note_volume_id(id: &str) {
    note(|ids| &mut ids.volume, id);
}

/// Notes the snapshot id of the request being served.
pub fn note_snapshot_id(id: &str) {
    note(|ids| &mut ids.snapshot, id);
}

fn note(slot: fn(&mut Ids) -> &mut Option<String>, id: &str) {
    let _ = IDS.try_with(|ids| {
        let mut ids = ids.lock().unwrap();
        let s = slot(&mut ids);
        if s.is_none() && !id.is_empty() {
            // Ids are bounded by validation; a rogue one is cut short.
            *s = Some(id.chars().take(256).collect());
        }
    });
}

/// Wraps a tonic server's routes; see the module documentation.
#[derive(Clone)]
pub struct ObserveLayer {
    metrics: Arc<Metrics>,
}

impl ObserveLayer {
    pub fn new(metrics: Arc<Metrics>) -> ObserveLayer {
        ObserveLayer { metrics }
    }
}

impl<S> tower_layer::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for Observe<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin,
{
    type Response = http::Response<Observed<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let path = req.uri().path().to_string();
        let call = Call::start(
            self.metrics.clone(),
            &path,
            req.headers()
                .get("grpc-timeout")
                .and_then(|v| v.to_str().ok())
                .and_then(grpc_timeout),
        );
        let fut = IDS.scope(call.ids.clone(), self.inner.call(req));
        Box::pin(async move {
            // Dropped here unfinished (the client left): `Call`'s drop
            // records it.
            let mut call = call;
            let res = fut.await;
            Ok(match res {
                Ok(mut resp) => {
                    name_unserved(&mut resp, &path);
                    // An error answered at once has its status in the
                    // headers and no body to wait for.
                    let call = match Status::from_header_map(resp.headers()) {
                        Some(s) => {
                            call.finish(s.code(), s.message());
                            None
                        }
                        None => Some(call),
                    };
                    resp.map(|inner| Observed { inner, call })
                }
                Err(e) => {
                    call.finish(Code::Internal, "the gRPC service failed");
                    return Err(e);
                }
            })
        })
    }
}

/// tonic answers a path no service serves with UNIMPLEMENTED and no
/// message; the Error Scheme wants a human-readable one. Other answers,
/// UNIMPLEMENTED with a message of the driver's own included, pass as
/// they are.
fn name_unserved<B>(resp: &mut http::Response<B>, path: &str) {
    let bare = Status::from_header_map(resp.headers())
        .is_some_and(|s| s.code() == Code::Unimplemented && s.message().is_empty());
    if !bare {
        return;
    }
    // grpc-message is percent-encoded: a path with a '%' is not repeated.
    let what = if path.contains('%') {
        "this method"
    } else {
        path
    };
    let message = format!(
        "{what} is not served by this driver{}do not call it: it is not advertised (GetPluginCapabilities, ControllerGetCapabilities, NodeGetCapabilities and the CSI-Addons GetCapabilities list what is served)",
        crate::error::REMEDY
    );
    if let Ok(v) = http::HeaderValue::from_str(&message) {
        resp.headers_mut().insert("grpc-message", v);
    }
}

/// A response body that finishes its call when the trailers with the
/// gRPC status pass, when it ends, or when it is dropped.
pub struct Observed<B> {
    inner: B,
    call: Option<Call>,
}

impl<B: Body<Data = Bytes> + Unpin> Body for Observed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(mut call) = this.call.take() {
            match &res {
                Poll::Ready(Some(Ok(frame))) => match frame.trailers_ref() {
                    Some(t) => match Status::from_header_map(t) {
                        Some(s) => call.finish(s.code(), s.message()),
                        None => call.finish(Code::Unknown, "trailers without a gRPC status"),
                    },
                    None => this.call = Some(call),
                },
                Poll::Ready(Some(Err(_))) => {
                    call.finish(Code::Internal, "the response body failed")
                }
                Poll::Ready(None) => {
                    call.finish(Code::Unknown, "the response ended without a gRPC status")
                }
                Poll::Pending => this.call = Some(call),
            }
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One call in flight; records itself once, at the latest when dropped.
pub struct Call {
    metrics: Arc<Metrics>,
    service: String,
    method: String,
    started: Instant,
    timeout: Option<Duration>,
    ids: Arc<Mutex<Ids>>,
    done: bool,
}

impl Call {
    fn start(metrics: Arc<Metrics>, path: &str, timeout: Option<Duration>) -> Call {
        // `/package.Service/Method`
        let (service, method) = path
            .trim_start_matches('/')
            .split_once('/')
            .unwrap_or(("", path));
        Call {
            metrics,
            service: service.to_string(),
            method: method.to_string(),
            started: Instant::now(),
            timeout,
            ids: Arc::default(),
            done: false,
        }
    }

    fn finish(&mut self, code: Code, message: &str) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let elapsed = self.started.elapsed();
        self.metrics.rpc(&self.service, &self.method, code, elapsed);
        let ids = self.ids.lock().unwrap().clone();
        let duration_ms = (elapsed.as_secs_f64() * 1e6).round() / 1e3;
        let (service, method, name) = (&self.service, &self.method, code_name(code));
        let (volume_id, snapshot_id) = (ids.volume.as_deref(), ids.snapshot.as_deref());
        match level(code) {
            Level::Ok => tracing::info!(target: "thinpool_csi::rpc", service, method, volume_id,
                snapshot_id, code = name, duration_ms, "rpc"),
            Level::Cancelled => tracing::info!(target: "thinpool_csi::rpc", service, method,
                volume_id, snapshot_id, code = name, duration_ms, error = message, "rpc"),
            Level::Failed => tracing::warn!(target: "thinpool_csi::rpc", service, method,
                volume_id, snapshot_id, code = name, duration_ms, error = message, "rpc"),
        }
    }
}

/// How a finished call is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// INFO.
    Ok,
    /// INFO, with the reason.
    Cancelled,
    /// WARN, with the reason.
    Failed,
}

/// Every failure is a WARN, whoever caused it: INVALID_ARGUMENT, NOT_FOUND
/// or FAILED_PRECONDITION that a sidecar or kubelet keeps getting is a
/// deployment that does not work (a StorageClass the driver refuses, a
/// path it does not serve), and at INFO it drowned among the successes.
/// DEADLINE_EXCEEDED too: the driver was slower than its caller allowed.
/// CANCELLED stays at INFO: the driver never answers it itself, it is
/// what this layer records when the caller went away (it gave up, or its
/// sidecar restarted); the driver did nothing wrong, a mutation goes on
/// detached and the caller's retry finds its result, so a WARN for each
/// would cry wolf on every sidecar restart.
fn level(code: Code) -> Level {
    match code {
        Code::Ok => Level::Ok,
        Code::Cancelled => Level::Cancelled,
        _ => Level::Failed,
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.done {
            if self.timeout.is_some_and(|t| self.started.elapsed() >= t) {
                self.finish(Code::DeadlineExceeded, "the call's deadline passed");
            } else {
                self.finish(Code::Cancelled, "the client went away before the answer");
            }
        }
    }
}

/// The `grpc-timeout` header: up to 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(v: &str) -> Option<Duration> {
    if !v.is_ascii() {
        return None;
    }
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(grpc_timeout("S"), None);
        assert_eq!(grpc_timeout("123456789S"), None);
        assert_eq!(grpc_timeout("5x"), None);
        assert_eq!(grpc_timeout(""), None);
    }

    #[test]
    fn ids_are_noted_only_inside_a_call() {
        note_volume_id("outside");
        let ids: Arc<Mutex<Ids>> = Arc::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(IDS.scope(ids.clone(), async {
            note_volume_id("csi-a");
            note_volume_id("csi-b");
            note_snapshot_id("snap-x");
        }));
        let ids = ids.lock().unwrap();
        assert_eq!(ids.volume.as_deref(), Some("csi-a"));
        assert_eq!(ids.snapshot.as_deref(), Some("snap-x"));
    }

    /// A stand-in for tonic's routes: answers after `delay` with `body`
    /// and `headers`.
    #[derive(Clone)]
    struct Fake {
        delay: Duration,
        headers: Vec<(&'static str, &'static str)>,
        /// Data frames (`None`) and trailers with a grpc-status.
        frames: Vec<Option<&'static str>>,
    }

    struct Frames(std::collections::VecDeque<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    impl tower_service::Service<http::Request<()>> for Fake {
        type Response = http::Response<Frames>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<Result<Self::Response, Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let me = self.clone();
            Box::pin(async move {
                note_volume_id("csi-fake");
                tokio::time::sleep(me.delay).await;
                let frames = me.frames.iter().map(|f| match f {
                    None => Frame::data(Bytes::from_static(b"x")),
                    Some(code) => trailers(code),
                });
                let mut r = http::Response::new(Frames(frames.collect()));
                for (k, v) in me.headers {
                    r.headers_mut().insert(k, http::HeaderValue::from_static(v));
                }
                Ok(r)
            })
        }
    }

    fn trailers(code: &'static str) -> Frame<Bytes> {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static(code));
        Frame::trailers(t)
    }

    fn request(timeout: Option<&'static str>) -> http::Request<()> {
        let mut r = http::Request::builder().uri("/csi.v1.Controller/DeleteVolume");
        if let Some(t) = timeout {
            r = r.header("grpc-timeout", t);
        }
        r.body(()).unwrap()
    }

    /// The samples of `family` in `m`'s exposition.
    fn series(m: &Metrics, family: &str) -> Vec<String> {
        let mut t = crate::metrics::text::Text::default();
        m.write(&mut t);
        t.finish()
            .lines()
            .filter(|l| l.starts_with(family))
            .map(str::to_string)
            .collect()
    }

    fn requests(m: &Metrics) -> usize {
        series(m, "thinpool_csi_rpc_requests_total")
            .first()
            .map_or(0, |l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
    }

    #[tokio::test]
    async fn a_bare_unimplemented_gets_a_message_and_others_stay() {
        use tower_layer::Layer;
        use tower_service::Service;
        let layer = ObserveLayer::new(Arc::new(Metrics::default()));
        let answer = |headers| {
            let layer = layer.clone();
            async move {
                let resp = layer
                    .layer(Fake {
                        delay: Duration::ZERO,
                        headers,
                        frames: vec![],
                    })
                    .call(request(None))
                    .await
                    .unwrap();
                Status::from_header_map(resp.headers()).unwrap()
            }
        };
        // tonic's answer to a path no service serves.
        let s = answer(vec![("grpc-status", "12")]).await;
        assert_eq!(s.code(), Code::Unimplemented);
        assert!(
            s.message().starts_with(
                "/csi.v1.Controller/DeleteVolume is not served by this driver. What to do: "
            ),
            "{}",
            s.message()
        );
        // The driver's own UNIMPLEMENTED, and other codes, pass unchanged.
        let s = answer(vec![("grpc-status", "12"), ("grpc-message", "ours")]).await;
        assert_eq!(s.message(), "ours");
        let s = answer(vec![("grpc-status", "5")]).await;
        assert_eq!((s.code(), s.message()), (Code::NotFound, ""));
    }

    #[tokio::test]
    async fn the_code_comes_from_headers_or_trailers_or_the_call_was_cancelled() {
        use tower_layer::Layer;
        use tower_service::Service;
        // This thread logs rpc lines too: with a subscriber that wants
        // them, so that tracing never caches "nobody wants these" while
        // the test below waits for them on another thread.
        let out = crate::logging::Captured::default();
        let _log = tracing::subscriber::set_default(crate::logging::subscriber(
            crate::logging::LogFormat::Json,
            "info",
            out.clone(),
            false,
        ));
        tracing::callsite::rebuild_interest_cache();
        let m = Arc::new(Metrics::default());
        let layer = ObserveLayer::new(m.clone());
        let fake = |delay_ms, headers, frames| {
            layer.layer(Fake {
                delay: Duration::from_millis(delay_ms),
                headers,
                frames,
            })
        };
        let drain = |mut body: Observed<Frames>| async move {
            while std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
                .await
                .is_some()
            {}
        };
        // A success: OK once the trailers pass, not before.
        let resp = fake(0, vec![], vec![None, Some("0")])
            .call(request(None))
            .await
            .unwrap();
        assert_eq!(requests(&m), 0);
        drain(resp.into_body()).await;
        assert_eq!(requests(&m), 1);
        assert!(series(&m, "thinpool_csi_rpc_errors_total").is_empty());
        // An error at once: in the headers.
        let resp = fake(0, vec![("grpc-status", "5")], vec![])
            .call(request(None))
            .await
            .unwrap();
        assert_eq!(requests(&m), 2);
        drop(resp);
        // A stream that failed later: in the trailers.
        let resp = fake(0, vec![], vec![None, Some("13")])
            .call(request(None))
            .await
            .unwrap();
        drain(resp.into_body()).await;
        // The client leaves before the answer; then a deadline passes.
        let call = fake(10_000, vec![], vec![]).call(request(None));
        assert!(tokio::time::timeout(Duration::from_millis(20), call)
            .await
            .is_err());
        let call = fake(10_000, vec![], vec![]).call(request(Some("30m")));
        assert!(tokio::time::timeout(Duration::from_millis(60), call)
            .await
            .is_err());
        // A body dropped before its trailers: the client went away.
        let resp = fake(0, vec![], vec![Some("0")])
            .call(request(None))
            .await
            .unwrap();
        drop(resp);
        assert_eq!(requests(&m), 6);
        let code = |c: &str, n: u32| {
            format!(
                "thinpool_csi_rpc_errors_total{{service=\"csi.v1.Controller\",method=\"DeleteVolume\",code=\"{c}\"}} {n}"
            )
        };
        assert_eq!(
            series(&m, "thinpool_csi_rpc_errors_total"),
            vec![
                code("CANCELLED", 2),
                code("DEADLINE_EXCEEDED", 1),
                code("INTERNAL", 1),
                code("NOT_FOUND", 1),
            ]
        );
        // Failures at WARN, the caller's cancellations and successes at
        // INFO.
        let levels: Vec<(String, String)> = out
            .text()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON log line"))
            .filter(|v| v["target"] == "thinpool_csi::rpc")
            .map(|v| {
                (
                    v["code"].as_str().unwrap().into(),
                    v["level"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want = |c: &str, l: &str| (c.to_string(), l.to_string());
        assert_eq!(
            levels,
            vec![
                want("OK", "INFO"),
                want("NOT_FOUND", "WARN"),
                want("INTERNAL", "WARN"),
                want("CANCELLED", "INFO"),
                want("DEADLINE_EXCEEDED", "WARN"),
                want("CANCELLED", "INFO"),
            ]
        );
    }

    #[test]
    fn client_caused_failures_are_warnings_too() {
        assert_eq!(level(Code::Ok), Level::Ok);
        assert_eq!(level(Code::Cancelled), Level::Cancelled);
        for c in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::OutOfRange,
            Code::Aborted,
            Code::Unimplemented,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Unavailable,
            Code::Internal,
            Code::Unknown,
        ] {
            assert_eq!(level(c), Level::Failed, "{c:?}");
        }
    }

    /// What each call of `each_call_logs_one_line_and_never_its_secrets`
    /// carries in its secrets, which no log line may show.
    const SECRET: &str = "s3cr3t-Pa55w0rd-value";

    /// The real servers, a real client: every call gives exactly one rpc
    /// line with its method, id and code, and counts in the metrics; the
    /// requests' secrets appear nowhere in the log, at any level.
    #[tokio::test]
    async fn each_call_logs_one_line_and_never_its_secrets() {
        use crate::config::Config;
        use crate::logging::{subscriber, Captured, LogFormat};

        let out = Captured::default();
        // Everything, from every crate (tonic, h2, hyper included).
        let _log = tracing::subscriber::set_default(subscriber(
            LogFormat::Json,
            "trace",
            out.clone(),
            false,
        ));
        // Tests on other threads, with no subscriber, may have met these
        // callsites first; tracing caches that nobody wanted them.
        tracing::callsite::rebuild_interest_cache();
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            lvm_binary: "/nonexistent/lvm".into(),
            state_dir: dir.path().join("state"),
            allowed_roots: vec![dir.path().to_path_buf()],
            ..Config::default()
        };
        let driver = Arc::new(crate::volume::classes::Classes::new(&cfg, "n1"));
        let (csi, addons) = (dir.path().join("csi.sock"), dir.path().join("addons.sock"));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let servers = tokio::spawn(futures_join(
            super::super::serve(
                driver.clone(),
                crate::socket::bind(&csi).unwrap(),
                until(stopped.clone()),
            ),
            super::super::serve_addons(
                driver.clone(),
                crate::socket::bind(&addons).unwrap(),
                until(stopped),
            ),
        ));
        let ours = crate::naming::lv_name_for("pvc-secret");
        calls_with_secrets(&csi, &addons, &ours).await;
        stop.send(true).unwrap();
        let (a, b) = servers.await.unwrap();
        a.unwrap();
        b.unwrap();

        one_rpc_line_per_call_and_no_secret(&out.text(), &ours);

        let m = driver.exposition().await;
        for line in [
            r#"thinpool_csi_rpc_requests_total{service="csi.v1.Controller",method="DeleteVolume"} 2"#,
            r#"thinpool_csi_rpc_errors_total{service="csi.v1.Controller",method="CreateVolume",code="INVALID_ARGUMENT"} 1"#,
            r#"thinpool_csi_rpc_errors_total{service="reclaimspace.ReclaimSpaceController",method="ControllerReclaimSpace",code="NOT_FOUND"} 1"#,
            r#"thinpool_csi_rpc_duration_seconds_count{service="csi.v1.Node",method="NodeStageVolume"} 1"#,
        ] {
            assert!(m.lines().any(|l| l == line), "missing {line:?} in\n{m}");
        }
    }

    /// The calls of `each_call_logs_one_line_and_never_its_secrets`, each
    /// with [`SECRET`] in its secrets, to the servers at `csi` and
    /// `addons`, and the code each must answer; `ours` is a volume id of
    /// this driver's shape.
    async fn calls_with_secrets(csi: &std::path::Path, addons: &std::path::Path, ours: &str) {
        use std::collections::HashMap;

        use crate::proto::csi::v1::controller_client::ControllerClient;
        use crate::proto::csi::v1::node_client::NodeClient;
        use crate::proto::csi::v1::*;
        use crate::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
        use crate::proto::reclaimspace::ControllerReclaimSpaceRequest;

        let uri = |p: &std::path::Path| format!("unix://{}", p.display());
        let mut ctl = ControllerClient::connect(uri(csi)).await.unwrap();
        let mut node = NodeClient::connect(uri(csi)).await.unwrap();
        let mut reclaim = ReclaimSpaceControllerClient::connect(uri(addons))
            .await
            .unwrap();
        let secrets: HashMap<String, String> =
            [("password".to_string(), SECRET.to_string())].into();

        // An id this driver never issues: OK without LVM.
        ctl.delete_volume(DeleteVolumeRequest {
            volume_id: "foreign-id".into(),
            secrets: secrets.clone(),
        })
        .await
        .unwrap();
        // One of ours, with no LVM to run: an error from the volume layer.
        let e = ctl
            .delete_volume(DeleteVolumeRequest {
                volume_id: ours.into(),
                secrets: secrets.clone(),
            })
            .await
            .unwrap_err();
        assert_ne!(e.code(), Code::Ok);
        let e = ctl
            .create_volume(CreateVolumeRequest {
                name: "pvc-secret".into(),
                secrets: secrets.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: ours.into(),
                staging_target_path: "/elsewhere/stage".into(),
                secrets: secrets.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = ctl
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: String::new(),
                secrets: secrets.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = reclaim
            .controller_reclaim_space(ControllerReclaimSpaceRequest {
                volume_id: "foreign-id".into(),
                secrets: secrets.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }

    /// The rule for the log of those calls: no secret, nor its key,
    /// anywhere in `text`; one rpc line a call, in order, with its method,
    /// volume id and code; its level by its code, a duration, a service,
    /// and an error exactly when it failed.
    fn one_rpc_line_per_call_and_no_secret(text: &str, ours: &str) {
        assert!(!text.contains(SECRET), "a secret reached the log:\n{text}");
        assert!(!text.contains("password"), "a secret's key reached the log");
        let rpc: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON log line"))
            .filter(|v| v["target"] == "thinpool_csi::rpc")
            .collect();
        let seen: Vec<(String, String, String)> = rpc
            .iter()
            .map(|v| {
                let s = |k: &str| v[k].as_str().unwrap_or("-").to_string();
                (s("method"), s("volume_id"), s("code"))
            })
            .collect();
        let want =
            |m: &str, id: &str, code: &str| (m.to_string(), id.to_string(), code.to_string());
        let delete_code = seen.get(1).map(|s| s.2.clone()).unwrap_or_default();
        assert_eq!(
            seen,
            vec![
                want("DeleteVolume", "foreign-id", "OK"),
                want("DeleteVolume", ours, &delete_code),
                want("CreateVolume", "-", "INVALID_ARGUMENT"),
                want("NodeStageVolume", ours, "INVALID_ARGUMENT"),
                want("DeleteSnapshot", "-", "INVALID_ARGUMENT"),
                want("ControllerReclaimSpace", "foreign-id", "NOT_FOUND"),
            ],
            "{text}"
        );
        assert_ne!(delete_code, "OK");
        for v in &rpc {
            let level = if v["code"] == "OK" { "INFO" } else { "WARN" };
            assert_eq!(v["level"], level, "{v}");
            assert!(v["duration_ms"].as_f64().is_some_and(|d| d >= 0.0), "{v}");
            assert!(v["service"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
            // Failures say why.
            assert_eq!(v["code"] != "OK", v["error"].is_string(), "{v}");
        }
    }

    async fn futures_join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
        tokio::join!(a, b)
    }
}
