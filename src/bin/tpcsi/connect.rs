//! The sockets a command talks to (flag, environment, config, defaults),
//! connecting to them when first needed, and printing the answer: one
//! command's context.

use thinpool_csi::config::{parse_endpoint, Config};
use thinpool_csi::proto::csi::v1 as csi;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use crate::args::Global;
use crate::failure::{Failure, Result};
use crate::output::{Done, Render};
use crate::progress::Progress;
use csi::controller_client::ControllerClient;
use csi::node_client::NodeClient;

/// The two sockets, as URIs: flag, else environment, else the config file
/// (`--config`), else the defaults (config/defaults.toml).
#[derive(Debug, PartialEq)]
pub struct Endpoints {
    pub csi: String,
    /// None when the config serves no CSI-Addons (`csi_addons_endpoint = ""`).
    pub addons: Option<String>,
    /// The metrics endpoint (`metrics_address`); None when there is none.
    pub metrics: Option<String>,
}

pub fn endpoints(g: &Global, env: impl Fn(&str) -> Option<String>) -> Result<Endpoints> {
    let cfg = match &g.config {
        Some(p) => Config::load(p).map_err(|e| Failure::Local(e.to_string()))?,
        None => Config::default(),
    };
    let csi = g
        .endpoint
        .clone()
        .or_else(|| env("CSI_ENDPOINT"))
        .unwrap_or(cfg.endpoint);
    let addons = g
        .addons_endpoint
        .clone()
        .or_else(|| env("CSI_ADDONS_ENDPOINT"))
        .unwrap_or(cfg.csi_addons_endpoint);
    let metrics = g
        .metrics_address
        .clone()
        .or_else(|| env("METRICS_ADDRESS"))
        .unwrap_or(cfg.metrics_address);
    Ok(Endpoints {
        csi,
        addons: Some(addons).filter(|a| !a.is_empty()),
        metrics: Some(metrics).filter(|m| !m.is_empty()),
    })
}

/// One command's connections (made when first needed) and printer.
pub struct Ctx {
    pub ends: Endpoints,
    pub json: bool,
    pub progress: Progress,
    pub csi: Option<Channel>,
    pub addons: Option<Channel>,
}

pub async fn connect(uri: &str) -> Result<Channel> {
    let path = parse_endpoint(uri).map_err(|e| Failure::Local(format!("endpoint {uri:?}: {e}")))?;
    let ep = Endpoint::from_shared(format!("unix://{}", path.display()))
        .map_err(|e| Failure::Local(format!("endpoint {uri:?}: {e}")))?;
    ep.connect().await.map_err(|e| {
        let mut msg = format!("cannot reach {uri}: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            // Transport errors repeat their cause in their own text.
            let text = s.to_string();
            if !msg.contains(&text) {
                msg.push_str(&format!(": {text}"));
            }
            src = s.source();
        }
        Failure::Connect(msg)
    })
}

impl Ctx {
    pub async fn csi(&mut self) -> Result<Channel> {
        if self.csi.is_none() {
            self.csi = Some(connect(&self.ends.csi).await?);
        }
        Ok(self.csi.clone().expect("connected"))
    }

    pub async fn addons(&mut self) -> Result<Channel> {
        let Some(uri) = self.ends.addons.clone() else {
            return Err(Failure::Local(
                "no CSI-Addons socket: the config's csi_addons_endpoint is empty; \
                 give --addons-endpoint"
                    .into(),
            ));
        };
        if self.addons.is_none() {
            self.addons = Some(connect(&uri).await?);
        }
        Ok(self.addons.clone().expect("connected"))
    }

    pub async fn controller(&mut self) -> Result<ControllerClient<Channel>> {
        Ok(ControllerClient::new(self.csi().await?))
    }

    pub async fn node(&mut self) -> Result<NodeClient<Channel>> {
        Ok(NodeClient::new(self.csi().await?))
    }

    /// Runs a call whose answer is success alone, and says what was done.
    pub async fn done<T>(
        &self,
        label: &str,
        call: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
        done: Done,
    ) -> Result<()> {
        self.progress.run(label, call).await?;
        self.show(&done);
        Ok(())
    }

    pub fn show<T: Render>(&self, v: &T) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(v).expect("output serializes")
            );
        } else {
            print!("{}", v.table());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn global(config: Option<PathBuf>, endpoint: Option<&str>) -> Global {
        Global {
            endpoint: endpoint.map(String::from),
            addons_endpoint: None,
            metrics_address: None,
            config,
            json: false,
            progress: false,
            timeout: None,
        }
    }

    #[test]
    fn endpoints_come_from_flag_then_environment_then_config() {
        let none = |_: &str| None;
        let d = endpoints(&global(None, None), none).unwrap();
        assert_eq!(
            d,
            Endpoints {
                csi: "unix:///run/thinpool-csi/csi.sock".into(),
                addons: Some("unix:///run/thinpool-csi/csi-addons.sock".into()),
                metrics: None,
            }
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            "endpoint = \"unix:///x/csi.sock\"\ncsi_addons_endpoint = \"\"\n",
        )
        .unwrap();
        let from_cfg = endpoints(&global(Some(cfg.clone()), None), none).unwrap();
        assert_eq!(from_cfg.csi, "unix:///x/csi.sock");
        assert_eq!(from_cfg.addons, None);
        let env = |k: &str| (k == "CSI_ENDPOINT").then(|| "unix:///env.sock".to_string());
        assert_eq!(
            endpoints(&global(Some(cfg.clone()), None), env)
                .unwrap()
                .csi,
            "unix:///env.sock"
        );
        assert_eq!(
            endpoints(&global(Some(cfg), Some("unix:///flag.sock")), env)
                .unwrap()
                .csi,
            "unix:///flag.sock"
        );
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "endpoitn = 1\n").unwrap();
        match endpoints(&global(Some(bad), None), none) {
            Err(Failure::Local(m)) => assert!(m.contains("endpoitn"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_absent_socket_is_a_connect_failure() {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("unix://{}/none.sock", dir.path().display());
        match connect(&uri).await {
            Err(f @ Failure::Connect(_)) => {
                assert_eq!(f.exit_status(), 3);
                assert!(f.line().contains("none.sock"), "{}", f.line());
            }
            other => panic!("{other:?}"),
        }
        match connect("tcp://1.2.3.4:5").await {
            Err(Failure::Local(m)) => assert!(m.contains("unix"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
