//! CSI-Addons EncryptionKeyRotation: parses the request and asks the
//! volume layer to rotate the volume's passphrase (`volume::crypt`).
//!
//! The driver keeps no key, so both come with the call: the new one in
//! `encryption_key` (required here, though the specification lets a
//! plugin that generates keys leave it out), the current one in the
//! secrets' `passphrase` (as NodeStageVolume gets it). A current key
//! that opens no key slot is UNAUTHENTICATED (the specification's table).

use tonic::{Request, Response, Status};

use super::addons::AddonsService;
use super::{reply, validate};
use crate::error::{Error, Result};
use crate::node::crypt;
use crate::proto::encryptionkeyrotation::encryption_key_rotation_controller_server::EncryptionKeyRotationController;
use crate::proto::encryptionkeyrotation::{
    EncryptionKeyRotateRequest, EncryptionKeyRotateResponse,
};

impl AddonsService {
    async fn rotate(&self, req: EncryptionKeyRotateRequest) -> Result<EncryptionKeyRotateResponse> {
        let id = validate::existing_volume_id(&req.volume_id)?;
        validate::addons_path_len("volume_path", &req.volume_path)?;
        validate::opaque_parameters(&req.parameters)?;
        if req.encryption_key.is_empty() || req.encryption_key.len() > validate::MAX_PASSPHRASE {
            return Err(Error::InvalidArgument(format!(
                "encryption_key must hold the new passphrase, 1 to {} bytes (it holds {}); this driver keeps no keys and makes none",
                validate::MAX_PASSPHRASE,
                req.encryption_key.len()
            )));
        }
        let keys = validate::passphrases(&req.secrets)?.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the secrets have no {:?}: the volume's current passphrase is needed to add the new one",
                crypt::PASSPHRASE_KEY
            ))
        })?;
        let new = crypt::Secret::new(req.encryption_key.as_bytes());
        self.classes
            .of(&id)?
            .rotate_key(id, keys.current.clone(), new)
            .await?;
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
