//! Test harness for the LVM suite: starts the real `thinpool-csi` binary on
//! its own loop-backed VG and socket, and gives tonic clients to it. Each
//! test has its own VG, loop file and socket, so tests run in parallel in
//! one VM.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::identity_client::IdentityClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::ProbeRequest;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

pub const DRIVER_NAME: &str = "thinpool.csi.test";
pub const NODE_ID: &str = "test-node";
pub const MIB: u64 = 1 << 20;

/// The LVM suite needs root and a kernel with device-mapper; without them
/// it fails loudly instead of skipping.
pub fn require_lvm() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the LVM suite must run as root: run `scripts/test.sh vm`"
    );
    let misc = std::fs::read_to_string("/proc/misc").unwrap_or_default();
    assert!(
        misc.contains("device-mapper"),
        "this kernel has no device-mapper: run the LVM suite in the VM (`scripts/test.sh vm`)"
    );
}

pub struct TestDriver {
    pub vg: String,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub backing: PathBuf,
    child: Option<Child>,
    /// A command the driver runs under (`nsenter --net=…`: a node of a
    /// cluster in its own network namespace); empty: none.
    pub prefix: Vec<String>,
    /// `--node-id` for the driver, over the config's.
    pub node_id: Option<String>,
}

impl TestDriver {
    /// Starts a driver on a fresh loop-backed VG of `size` bytes; `extra`
    /// is appended to the top level of its config.
    pub async fn start(name: &str, size: u64, extra: &str) -> TestDriver {
        Self::start_with_env(name, size, extra, &[]).await
    }

    /// Starts a driver on an existing config file whose VG and backing
    /// file are `vg` and `backing`.
    pub async fn with_config(
        dir: tempfile::TempDir,
        config: PathBuf,
        vg: String,
        backing: PathBuf,
    ) -> TestDriver {
        let mut d = Self::unstarted(dir, config, vg, backing);
        d.spawn().await;
        d
    }

    /// The driver of `config` in `dir`, not running yet.
    fn unstarted(
        dir: tempfile::TempDir,
        config: PathBuf,
        vg: String,
        backing: PathBuf,
    ) -> TestDriver {
        TestDriver {
            vg,
            socket: dir.path().join("csi.sock"),
            dir,
            config,
            backing,
            child: None,
            prefix: vec![],
            node_id: None,
        }
    }

    /// [`TestDriver::start`] with `env` added to the driver's environment,
    /// as an image's `ENV` lines put it there (`LVM_SYSTEM_DIR`). The
    /// config is the one [`TestDriver::start`] writes; restart such a
    /// driver with [`TestDriver::restart_with_env`].
    pub async fn start_with_env(
        name: &str,
        size: u64,
        extra: &str,
        env: &[(String, String)],
    ) -> TestDriver {
        Self::start_with_loop_keys(name, size, extra, "", env).await
    }

    /// [`TestDriver::start_with_env`] with `loop_keys` (lines) added to
    /// the `[loop_pool]` table.
    pub async fn start_with_loop_keys(
        name: &str,
        size: u64,
        extra: &str,
        loop_keys: &str,
        env: &[(String, String)],
    ) -> TestDriver {
        let mut d = Self::prepared(name, size, extra, loop_keys);
        d.spawn_with_env(env).await;
        d
    }

    /// The driver [`TestDriver::start_with_loop_keys`] starts, with its
    /// config written, not running yet (set `prefix` or `node_id`, then
    /// spawn it).
    pub fn prepared(name: &str, size: u64, extra: &str, loop_keys: &str) -> TestDriver {
        require_lvm();
        let dir = tempfile::Builder::new()
            .prefix(&format!("tpcsi-{name}-"))
            .tempdir()
            .unwrap();
        let vg = format!("tpt-{name}");
        let config = dir.path().join("config.toml");
        let text = format!(
            "driver_name = \"{DRIVER_NAME}\"\nnode_id = \"{NODE_ID}\"\nvolume_group = \"{vg}\"\n\
             thin_pool = \"pool\"\nudev = \"off\"\n\
             csi_addons_endpoint = \"unix://{dir}/addons.sock\"\nstate_dir = \"{dir}/state\"\n{extra}\n\
             [loop_pool]\nbacking_file = \"{dir}/pool.img\"\nsize = {size}\n{percent}{loop_keys}\n",
            percent = if loop_keys.contains("pool_percent") {
                ""
            } else {
                "pool_percent = 80\n"
            },
            dir = dir.path().display()
        );
        // Tests read LVM behind the driver's back: no cached reports
        // unless a test asks for them.
        let text = if extra.contains("report_max_age_secs") {
            text
        } else {
            format!("report_max_age_secs = 0\n{text}")
        };
        std::fs::write(&config, text).unwrap();
        let backing = dir.path().join("pool.img");
        Self::unstarted(dir, config, vg, backing)
    }

    /// [`TestDriver::spawn`] with `env` added to the driver's environment.
    pub async fn spawn_with_env(&mut self, env: &[(String, String)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("driver.log"))
            .unwrap();
        let bin = env!("CARGO_BIN_EXE_thinpool-csi");
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        if let Some(id) = &self.node_id {
            cmd.args(["--node-id", id]);
        }
        let child = cmd
            .arg("--config")
            .arg(&self.config)
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start thinpool-csi");
        self.child = Some(child);
        self.wait_ready().await;
    }

    /// [`TestDriver::restart`] of a driver started with `env`.
    pub async fn restart_with_env(&mut self, env: &[(String, String)]) {
        self.stop();
        self.spawn_with_env(env).await;
    }

    /// Starts the driver process (again) on this config.
    pub async fn spawn(&mut self) {
        self.spawn_with_env(&[]).await;
    }

    /// [`TestDriver::spawn`], then waits until this start's heal of the
    /// staged volumes has ended (`driver.log` holds every earlier start's
    /// too). The heal holds each volume's lock while it works, so a call
    /// made meanwhile is ABORTED, as kubelet's would be before its retry.
    pub async fn spawn_and_heal(&mut self) {
        const DONE: &str = "start-up heal done";
        let before = self.log().matches(DONE).count();
        self.spawn().await;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.log().matches(DONE).count() == before {
            assert!(
                Instant::now() < deadline,
                "no start-up heal within 120 s: {}",
                self.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("driver exited early ({status}); log:\n{}", self.log());
            }
            if self.socket.exists() {
                if let Ok(mut c) = self.try_identity().await {
                    if c.probe(ProbeRequest {}).await.is_ok() {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "driver not ready after 180 s; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("driver.log")).unwrap_or_default()
    }

    /// Stops the driver with SIGTERM and starts it again on the same
    /// config; the pool and volumes stay.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs a second driver process on this config (with `args` added)
    /// that is expected to exit on its own; returns its exit status, its
    /// stderr and how long it ran. Panics if it still runs after 60 s.
    pub async fn run_to_exit(&self, args: &[&str]) -> (std::process::ExitStatus, String, Duration) {
        let errlog = self.dir.path().join("run-to-exit.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_thinpool-csi"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&errlog).unwrap())
            .spawn()
            .unwrap();
        let t = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("a driver expected to exit still runs after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        (
            status,
            std::fs::read_to_string(&errlog).unwrap(),
            t.elapsed(),
        )
    }

    /// Stops the driver with SIGKILL (no clean-up of any kind), and reaps
    /// it. Processes it started (lvm, mkfs) are left running, as they are
    /// when only the driver process dies; see
    /// [`TestDriver::kill9_with_children`] for a container-like kill.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILLs the driver and every process below it, as killing its
    /// container would: the driver is SIGSTOPped first so that it starts
    /// nothing new while its descendants are collected.
    pub fn kill9_with_children(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id() as i32;
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGSTOP);
            let tree = descendants(pid);
            let _ = c.kill();
            for p in tree {
                let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            let _ = c.wait();
        }
    }

    /// Whether the driver process is running (not exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// The driver's `state_dir` (as the harness configures it).
    /// The driver's process id (for benches/perf.rs).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("driver running").id()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The last `lines` lines of the driver log, for failure reports.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The CSI socket's URI.
    pub fn uri(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    async fn try_identity(&self) -> Result<IdentityClient<Channel>, tonic::transport::Error> {
        IdentityClient::connect(self.uri()).await
    }

    pub async fn identity(&self) -> IdentityClient<Channel> {
        self.try_identity().await.expect("connect identity")
    }

    /// The CSI-Addons socket of a driver started by [`TestDriver::start`].
    pub fn addons_uri(&self) -> String {
        format!("unix://{}", self.dir.path().join("addons.sock").display())
    }

    /// GetCapacity with no parameters (the pool as a whole).
    pub async fn capacity(&self) -> thinpool_csi::proto::csi::v1::GetCapacityResponse {
        self.controller()
            .await
            .get_capacity(thinpool_csi::proto::csi::v1::GetCapacityRequest::default())
            .await
            .expect("GetCapacity")
            .into_inner()
    }

    /// The condition ControllerGetVolume reports for volume `id`.
    pub async fn condition(&self, id: &str) -> thinpool_csi::proto::csi::v1::VolumeCondition {
        self.controller()
            .await
            .controller_get_volume(thinpool_csi::proto::csi::v1::ControllerGetVolumeRequest {
                volume_id: id.into(),
            })
            .await
            .expect("ControllerGetVolume")
            .into_inner()
            .status
            .and_then(|s| s.volume_condition)
            .expect("a volume condition")
    }

    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::connect(self.uri())
            .await
            .expect("connect controller")
    }

    pub async fn node(&self) -> NodeClient<Channel> {
        NodeClient::connect(self.uri()).await.expect("connect node")
    }

    pub fn backing_file(&self) -> PathBuf {
        self.backing.clone()
    }
}

impl Drop for TestDriver {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("driver log (last 40 lines):\n{}", self.log_tail(40));
        }
        // Leave nothing behind for the other tests in this VM.
        let _ = try_lvm(&["vgremove", "--yes", "--force", &self.vg]);
        if let Ok(Some(dev)) = thinpool_csi::pool::loopdev::find_loop_for_file(&self.backing_file())
        {
            let dev_s = dev.display().to_string();
            let _ = try_lvm(&["pvremove", "--yes", &dev_s]);
            let _ = thinpool_csi::pool::loopdev::detach_loop(&dev);
        }
    }
}

/// Runs an LVM command (with the settings for a system without udev) and
/// returns stdout; panics with stderr on failure.
/// Runs a bare command as an operator would (no extra LVM settings unless
/// `args` give them) and returns its wall time; panics when it fails. The
/// benches' (`benches/perf.rs`, `benches/scale.rs`), which share this file.
#[allow(dead_code)]
pub fn bare(cmd: &str, args: &[&str]) -> f64 {
    let t = Instant::now();
    let out = Command::new(cmd)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let took = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

pub fn lvm(args: &[&str]) -> String {
    try_lvm(args).unwrap_or_else(|e| panic!("lvm {args:?}: {e}"))
}

pub fn try_lvm(args: &[&str]) -> Result<String, String> {
    let (sub, rest) = args.split_first().unwrap();
    let out = Command::new("lvm")
        .arg(sub)
        .arg("--config")
        .arg("activation { udev_rules = 0 udev_sync = 0 } devices { obtain_device_list_from_udev = 0 }")
        .args(rest)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    stdout_or_stderr(out)
}

/// Writes `dir/lvm`, a script to use as the driver's `lvm_binary`: it
/// writes one line to `dir/lvm-calls.log` per LVM command, then runs the
/// real `lvm`. Started without arguments it is LVM's shell: each line the
/// driver sends it is one command, and is written to the log as it passes
/// (a shell's first line is its start-up check, `version`). Returns the
/// script and the log.
pub fn counting_lvm(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("lvm-calls.log");
    let script = dir.join("lvm");
    // lvm replaces the script, so the driver's signals (timeout, parent
    // death) reach lvm itself; it reads what tee passes on through a FIFO
    // beside the log (the VM has no /dev/fd for `<(...)`). tee gets the
    // driver's pipe as fd 4, since sh gives a background job /dev/null as
    // its stdin. fd 3 is the shell's report pipe, which tee does not keep,
    // so that the driver sees it close when lvm ends.
    let text = format!(
        "#!/bin/sh\nif [ $# -eq 0 ]; then\n  f={log}.shell-$$\n  mkfifo \"$f\"\n  exec 4<&0\n  tee -a {log} <&4 >\"$f\" 3>&- 4<&- &\n  exec lvm <\"$f\" 4<&-\nelse\n  echo \"$1\" >> {log}\n  exec lvm \"$@\"\nfi\n",
        log = log.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, log)
}

/// The lines of a text file; none when it is missing.
pub fn file_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// `lvs` of one VG, parsed by the driver's own parser.
pub fn lvs(vg: &str) -> thinpool_csi::lvm::report::Report {
    let argv = lvs_argv(vg);
    let out = lvm(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    thinpool_csi::lvm::report::Report::parse(&out).unwrap()
}

/// What GetCapacity answers for `vg`'s thin pool `pool` at overprovision
/// `ratio`, worked out from a fresh `lvs` (no autopilot, no create in
/// flight): `(available_capacity, maximum_volume_size)`, in whole extents.
pub fn capacity_from_lvs(vg: &str, ratio: f64) -> (u64, u64) {
    let r = lvs(vg);
    let pool = r.find("pool").unwrap();
    let virtual_sum: u64 = r.thin_volumes("pool").map(|lv| lv.size).sum();
    let headroom = ((pool.size as f64 * ratio) as u64).saturating_sub(virtual_sum);
    let used = (pool.size as f64 * pool.data_percent.unwrap() / 100.0).ceil() as u64;
    let extent = pool.vg_extent_size;
    let whole = |b: u64| b / extent * extent;
    (whole(headroom.min(pool.size - used)), whole(headroom))
}

/// The driver's own report of `vg`, as `lvm`'s arguments (`lvs` first).
pub fn lvs_argv(vg: &str) -> Vec<String> {
    let mut argv = vec!["lvs".to_string()];
    argv.extend(thinpool_csi::lvm::report::lvs_args(vg));
    argv
}

/// The figure in kB of a `Key:   N kB` line of a /proc file
/// (`/proc/meminfo`, `/proc/<pid>/status`); `None` when it has none.
/// The benches' (their memory figures).
#[allow(dead_code)]
pub fn proc_kib(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// A device class's second loop-backed VG, which the driver builds from a
/// `loop_pool` of the class: its VG and loop file are removed when this
/// is dropped (after the driver that built them).
pub struct SecondPool {
    pub vg: String,
    pub file: PathBuf,
}

impl SecondPool {
    /// The VG `tpt-<name>` on a loop file in the temporary directory.
    pub fn new(name: &str) -> SecondPool {
        SecondPool {
            vg: format!("tpt-{name}"),
            file: std::env::temp_dir().join(format!("tpcsi-{name}-{}.img", std::process::id())),
        }
    }
}

impl Drop for SecondPool {
    fn drop(&mut self) {
        let _ = try_lvm(&["vgremove", "--yes", "--force", &self.vg]);
        if let Ok(Some(dev)) = thinpool_csi::pool::loopdev::find_loop_for_file(&self.file) {
            let _ = try_lvm(&["pvremove", "--yes", &dev.display().to_string()]);
            let _ = thinpool_csi::pool::loopdev::detach_loop(&dev);
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Runs a command and panics unless it succeeds.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every process below `pid` (children, grandchildren, ...), from /proc.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            // /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold
            // spaces and parentheses, so split after the last ')'.
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, parent) in &parent_of {
            if parent == p && !out.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// How long [`retry`] keeps trying before it gives up.
pub const RETRY_FOR: Duration = Duration::from_secs(120);

/// Calls `call` as a CO would: with no deadline, again after 100 ms for
/// as long as it answers ABORTED (another operation on the volume is still
/// running) or UNAVAILABLE, up to [`RETRY_FOR`]. Panics with the last
/// status on any other error or when time is up. Returns the reply and the
/// number of retries.
pub async fn retry_n<T, F, Fut>(what: &str, mut call: F) -> (T, u32)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    let start = Instant::now();
    let mut retries = 0;
    loop {
        match call().await {
            Ok(r) => return (r.into_inner(), retries),
            Err(s) if matches!(s.code(), Code::Aborted | Code::Unavailable) => {
                assert!(
                    start.elapsed() < RETRY_FOR,
                    "{what}: still {:?} after {retries} retries in {:?}: {}",
                    s.code(),
                    start.elapsed(),
                    s.message()
                );
                retries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!(
                "{what}: {:?} after {retries} retries: {}",
                s.code(),
                s.message()
            ),
        }
    }
}

/// [`retry_n`] without the count.
pub async fn retry<T, F, Fut>(what: &str, call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    retry_n(what, call).await.0
}

/// How a call given a deadline ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Abandoned {
    /// It answered OK within the deadline.
    Ok,
    /// It answered an error (DEADLINE_EXCEEDED from the gRPC deadline, or
    /// the driver's own) within the deadline.
    Failed(Code),
    /// The client gave up and dropped the call.
    Dropped,
}

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Abandoned::Ok => write!(f, "ok"),
            Abandoned::Failed(c) => write!(f, "{c:?}"),
            Abandoned::Dropped => write!(f, "dropped"),
        }
    }
}

/// Sends `req` with a gRPC deadline of `deadline` through `call`, and
/// drops the call (cancelling it on the wire) if no answer came by then,
/// as a CO does when its own timeout passes.
pub async fn abandon_after<Req, T, F, Fut>(deadline: Duration, req: Req, call: F) -> Abandoned
where
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    let mut r = tonic::Request::new(req);
    r.set_timeout(deadline);
    match tokio::time::timeout(deadline, call(r)).await {
        Err(_) => Abandoned::Dropped,
        Ok(Ok(_)) => Abandoned::Ok,
        Ok(Err(s)) => Abandoned::Failed(s.code()),
    }
}

/// `dmsetup` with libdevmapper told not to wait for udev (the VM has none)
/// and to make its /dev/mapper nodes itself.
/// A finished command's stdout, or its stderr when it failed.
fn stdout_or_stderr(out: std::process::Output) -> Result<String, String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

pub fn dmsetup(args: &[&str]) -> Result<String, String> {
    let out = Command::new("dmsetup")
        .args(args)
        .args(["--noudevsync", "--noudevrules"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    stdout_or_stderr(out)
}

/// Every device-mapper device: name and device numbers, from `dmsetup ls`
/// (which prints `name\t(254:3)`, or `(254, 3)` on older releases).
pub fn dm_devices() -> Vec<(String, (u32, u32))> {
    let out = sh("dmsetup", &["ls"]);
    out.lines()
        .filter_map(|l| {
            let (name, nums) = l.rsplit_once('(')?;
            let nums = nums.trim_end_matches(')');
            let (ma, mi) = nums.split_once([':', ','])?;
            Some((
                name.trim().to_string(),
                (ma.trim().parse().ok()?, mi.trim().parse().ok()?),
            ))
        })
        .collect()
}

/// The device-mapper name prefix of the LVs of `vg` (LVM doubles every
/// `-` of the VG and LV names).
pub fn dm_prefix(vg: &str) -> String {
    format!("{}-", vg.replace('-', "--"))
}

/// The device-mapper name LVM gives LV `lv` of `vg`.
pub fn dm_name(vg: &str, lv: &str) -> String {
    format!("{}{}", dm_prefix(vg), lv.replace('-', "--"))
}

/// The device-mapper devices of `vg`'s LVs.
pub fn dm_of_vg(vg: &str) -> Vec<String> {
    let prefix = dm_prefix(vg);
    dm_devices()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// The device-mapper devices a thin pool `pool` of `vg` may keep while it
/// is active and serves no volume.
pub fn pool_dm_names(vg: &str, pool: &str) -> Vec<String> {
    ["", "_tdata", "_tmeta", "-tpool"]
        .iter()
        .map(|suffix| format!("{}{suffix}", dm_name(vg, pool)))
        .collect()
}

/// The driver's read-only overlays of volume `id` (`tpcsi-ro-<id>-…`).
pub fn overlays_of(id: &str) -> Vec<String> {
    let prefix = format!("tpcsi-ro-{id}-");
    dm_devices()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// The device-mapper table of the device `major:minor` (`dmsetup table`),
/// or None when it is no device-mapper device.
pub fn dm_table_of(dev: (u32, u32)) -> Option<String> {
    let name =
        std::fs::read_to_string(format!("/sys/dev/block/{}:{}/dm/name", dev.0, dev.1)).ok()?;
    dmsetup(&["table", name.trim()]).ok()
}

/// The device numbers a block device node refers to.
pub fn rdev_of(node: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::symlink_metadata(node).ok()?;
    if !m.file_type().is_block_device() {
        return None;
    }
    let rdev = m.rdev();
    Some((
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    ))
}

/// Unmounts everything mounted at or below `root`, deepest first (and
/// stacked mounts one by one); panics if something stays mounted.
pub fn umount_all_under(root: &Path) -> usize {
    let mut n = 0;
    for _ in 0..32 {
        let mut points: Vec<PathBuf> = thinpool_csi::mountinfo::MountInfo::read()
            .unwrap()
            .mounts()
            .iter()
            .filter(|m| m.mount_point.starts_with(root))
            .map(|m| m.mount_point.clone())
            .collect();
        if points.is_empty() {
            return n;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            nix::mount::umount2(&p, nix::mount::MntFlags::empty())
                .unwrap_or_else(|e| panic!("umount {}: {e}", p.display()));
            n += 1;
        }
    }
    panic!("mounts keep appearing under {}", root.display());
}

/// Writes dirty pages back and drops the page cache, so the next read
/// comes from the device.
pub fn drop_caches() {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop the page cache");
}

/// Who holds the block device `dev` open, for failure messages: the
/// processes with a file descriptor on it, and the devices stacked on it.
pub fn openers(dev: (u32, u32)) -> String {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        for fd in std::fs::read_dir(p.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(m) = std::fs::metadata(fd.path()) else {
                continue;
            };
            let rdev = m.rdev();
            if m.file_type().is_block_device()
                && (
                    nix::sys::stat::major(rdev) as u32,
                    nix::sys::stat::minor(rdev) as u32,
                ) == dev
            {
                let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                found.push(format!("pid {pid} ({})", comm.trim()));
            }
        }
    }
    let holders: Vec<String> =
        std::fs::read_dir(format!("/sys/dev/block/{}:{}/holders", dev.0, dev.1))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
    format!("processes {found:?}, holders {holders:?}")
}

/// What a [`paced_write`] saw.
#[derive(Debug)]
pub struct Paced {
    /// Bytes written before the end or the first error.
    pub written: u64,
    /// The slowest chunk's write.
    pub slowest: Duration,
    /// The whole write, from its first chunk to its last.
    pub took: Duration,
    /// The first failed write, if one failed.
    pub error: Option<String>,
}

/// Writes `total` bytes to the block device `dev` with direct I/O in
/// chunks of `chunk` bytes, chunk `i` not before `i × chunk / rate` seconds
/// from the start: a writer at `rate` bytes a second (or slower, when a
/// write takes longer than its share). Stops at the first failed write.
pub fn paced_write(dev: &Path, rate: u64, total: u64, chunk: usize) -> Paced {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {}: {e}", dev.display()));
    // O_DIRECT wants an aligned buffer; a non-zero pattern.
    let layout = std::alloc::Layout::from_size_align(chunk, 4096).unwrap();
    // SAFETY: the layout has a non-zero size (chunk > 0, checked by
    // from_size_align's caller contract below) and is freed below.
    assert!(chunk > 0);
    let ptr = unsafe { std::alloc::alloc(layout) };
    assert!(!ptr.is_null());
    // SAFETY: ptr is a live allocation of `chunk` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, chunk) };
    buf.fill(0x5a);
    let start = Instant::now();
    let mut out = Paced {
        written: 0,
        slowest: Duration::ZERO,
        took: Duration::ZERO,
        error: None,
    };
    let mut i = 0u64;
    while out.written < total {
        let due = start + Duration::from_secs_f64(i as f64 * chunk as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        let res = f.write_all_at(buf, out.written);
        out.slowest = out.slowest.max(t.elapsed());
        if let Err(e) = res {
            out.error = Some(format!("write at {} MiB: {e}", out.written / MIB));
            break;
        }
        out.written += chunk as u64;
        i += 1;
    }
    out.took = start.elapsed();
    // SAFETY: allocated above with this layout; `buf` is not used again.
    unsafe { std::alloc::dealloc(ptr, layout) };
    out
}

/// The kernel's log from the moment it is made (`/dev/kmsg`, read without
/// a program): what dm-thin said about a pool meanwhile.
pub struct KernelLog {
    fd: std::fs::File,
}

impl KernelLog {
    pub fn new() -> KernelLog {
        use std::os::unix::fs::OpenOptionsExt;
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .expect("open /dev/kmsg");
        // From now on: skip what the buffer holds.
        nix::unistd::lseek(&fd, 0, nix::unistd::Whence::SeekEnd).expect("seek /dev/kmsg");
        KernelLog { fd }
    }

    /// The messages logged since it was made (or last read).
    pub fn read(&mut self) -> Vec<String> {
        use std::io::Read;
        let mut lines = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            match self.fd.read(&mut buf) {
                // One record a read: "prio,seq,usec,flags;message\n...".
                Ok(0) => break,
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let msg = rec.split_once(';').map_or(&*rec, |(_, m)| m);
                    lines.push(msg.lines().next().unwrap_or("").to_string());
                }
                // Records overwritten before we read them: go on.
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("read /dev/kmsg: {e}"),
            }
        }
        lines
    }
}

impl Default for KernelLog {
    fn default() -> Self {
        Self::new()
    }
}

/// dm-thin's name for the thin-pool device of `vg`'s pool `pool` in its
/// log lines (`major:minor`), while a thin volume of it is active.
pub fn pool_kernel_name(vg: &str, pool: &str) -> Option<String> {
    let node = PathBuf::from("/dev/mapper").join(format!("{}-tpool", dm_name(vg, pool)));
    rdev_of(&node).map(|(ma, mi)| format!("{ma}:{mi}"))
}

/// The lines of `log` in which dm-thin says the pool `kname`
/// ([`pool_kernel_name`]) switched to out-of-data-space mode (queueing
/// writes, or failing them under error_if_no_space).
pub fn out_of_space_switches(log: &[String], kname: &str) -> Vec<String> {
    log.iter()
        .filter(|l| l.contains(&format!("{kname}: switching pool to out-of-data-space")))
        .cloned()
        .collect()
}
