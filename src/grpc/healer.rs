//! CSI-Addons NodeHealer: parses the request and asks the volume layer to
//! check and heal the volume (`crate::volume::heal`).

use tonic::{Request, Response, Status};

use super::node::NodeService;
use super::{reply, validate};
use crate::error::{Error, Result};
use crate::proto::healer::healer_node_server::HealerNode;
use crate::proto::healer::{NodeHealerRequest, NodeHealerResponse};
use crate::volume::NodePath;

impl NodeService {
    fn addons_path(&self, field: &str, v: &str) -> Result<NodePath> {
        validate::addons_path_len(field, v)?;
        self.path(field, v)
    }

    async fn node_healer_call(&self, req: NodeHealerRequest) -> Result<NodeHealerResponse> {
        let id = validate::existing_volume_id(&req.volume_id, self.classes.ids())?;
        if req.volume_path.is_empty() {
            return Err(Error::InvalidArgument("volume_path is required".into()));
        }
        let target = self.addons_path("volume_path", &req.volume_path)?;
        let staging = match req.staging_target_path.as_str() {
            "" => None,
            s => Some(self.addons_path("staging_target_path", s)?),
        };
        let cap = req
            .volume_capability
            .as_ref()
            .map(|c| self.capability(Some(&id), Some(c)))
            .transpose()?;
        let class = crate::naming::class_of(id.as_str()).to_string();
        let v = self.classes.of(&id)?.heal(id, target, staging, cap).await?;
        Ok(NodeHealerResponse {
            abnormal: v.abnormal,
            message: format!("device class {class}: {}", v.message),
        })
    }
}

#[tonic::async_trait]
impl HealerNode for NodeService {
    async fn node_healer(
        &self,
        r: Request<NodeHealerRequest>,
    ) -> Result<Response<NodeHealerResponse>, Status> {
        reply(self.node_healer_call(r.into_inner()).await)
    }
}
