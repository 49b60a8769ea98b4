//! CSI-Addons EncryptionKeyRotation: parses the request and asks the
//! volume layer to rotate the volume's passphrase (`volume::crypt`).
//!
//! The driver keeps no key, so both come with the call
//! (`validate::rotation_keys`): the new one in `encryption_key`, or, as
//! the csi-addons sidecar sends no `encryption_key`, in the node-stage
//! Secret's `nextPassphrase`; the current one in the Secret's
//! `passphrase`. A current key that opens no key slot is UNAUTHENTICATED
//! (the specification's table).

use tonic::{Request, Response, Status};

use super::addons::AddonsService;
use super::{reply, validate};
use crate::error::Result;
use crate::proto::encryptionkeyrotation::encryption_key_rotation_controller_server::EncryptionKeyRotationController;
use crate::proto::encryptionkeyrotation::{
    EncryptionKeyRotateRequest, EncryptionKeyRotateResponse,
};

impl AddonsService {
    async fn rotate(&self, req: EncryptionKeyRotateRequest) -> Result<EncryptionKeyRotateResponse> {
        let id = validate::existing_volume_id(&req.volume_id, self.classes.ids())?;
        validate::addons_path_len("volume_path", &req.volume_path)?;
        validate::opaque_parameters(&req.parameters)?;
        let (current, new) = validate::rotation_keys(&req.encryption_key, &req.secrets)?;
        self.classes.of(&id)?.rotate_key(id, current, new).await?;
        Ok(EncryptionKeyRotateResponse {})
    }
}

#[tonic::async_trait]
impl EncryptionKeyRotationController for AddonsService {
    async fn encryption_key_rotate(
        &self,
        r: Request<EncryptionKeyRotateRequest>,
    ) -> Result<Response<EncryptionKeyRotateResponse>, Status> {
        reply(self.rotate(r.into_inner()).await)
    }
}
