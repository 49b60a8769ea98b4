//! Test harness for the LVM suite: starts the real `thinpool-csi` binary on
//! its own loop-backed VG and socket, and gives tonic clients to it. Each
//! test has its own VG, loop file and socket, so tests run in parallel in
//! one VM.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::identity_client::IdentityClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::ProbeRequest;
use tonic::transport::Channel;

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
}

impl TestDriver {
    /// Starts a driver on a fresh loop-backed VG of `size` bytes; `extra`
    /// is appended to the top level of its config.
    pub async fn start(name: &str, size: u64, extra: &str) -> TestDriver {
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
             [loop_pool]\nbacking_file = \"{dir}/pool.img\"\nsize = {size}\npool_percent = 80\n",
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
        Self::with_config(dir, config, vg, backing).await
    }

    /// Starts a driver on an existing config file whose VG and backing
    /// file are `vg` and `backing`.
    pub async fn with_config(
        dir: tempfile::TempDir,
        config: PathBuf,
        vg: String,
        backing: PathBuf,
    ) -> TestDriver {
        let mut d = TestDriver {
            vg,
            socket: dir.path().join("csi.sock"),
            dir,
            config,
            backing,
            child: None,
        };
        d.spawn().await;
        d
    }

    /// Starts the driver process (again) on this config.
    pub async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("driver.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_thinpool-csi"))
            .arg("--config")
            .arg(&self.config)
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start thinpool-csi");
        self.child = Some(child);
        self.wait_ready().await;
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
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn uri(&self) -> String {
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
        // Leave nothing behind for the other tests in this VM.
        let _ = try_lvm(&["vgremove", "--yes", "--force", &self.vg]);
        if let Ok(Some(dev)) = thinpool_csi::sys::find_loop_for_file(&self.backing_file()) {
            let dev_s = dev.display().to_string();
            let _ = try_lvm(&["pvremove", "--yes", &dev_s]);
            let _ = thinpool_csi::sys::detach_loop(&dev);
        }
    }
}

/// Runs an LVM command (with the settings for a system without udev) and
/// returns stdout; panics with stderr on failure.
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
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `lvs` of one VG, parsed by the driver's own parser.
pub fn lvs(vg: &str) -> thinpool_csi::lvm::report::Report {
    let args = thinpool_csi::lvm::report::lvs_args(vg);
    let mut argv = vec!["lvs"];
    argv.extend(args.iter().map(String::as_str));
    let out = lvm(&argv);
    thinpool_csi::lvm::report::Report::parse(&out).unwrap()
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
