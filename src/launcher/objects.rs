//! Where a job's objects are: the shared storage (local runner), or the job's scoped access (a
//! pod, which holds no storage credentials).

use std::path::Path;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::Error;
use crate::shared::BoxError;
use crate::storage::Storage;
use crate::storage::access::JobAccess;

/// Where a job's objects are: the shared storage (local runner), or the job's scoped access
/// (a pod, which holds no storage credentials).
#[async_trait::async_trait]
pub trait JobObjects: Send + Sync {
    /// Streams the object `key` into `destination`; false when there is no such object.
    async fn fetch(&self, key: &str, destination: &Path) -> Result<bool, BoxError>;
    async fn store_file(&self, key: &str, path: &Path) -> Result<(), BoxError>;
    async fn store_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BoxError>;
    /// The shared storage, when the launcher has it (to mirror the user's file area).
    fn shared(&self) -> Option<&Storage>;
}

#[async_trait::async_trait]
impl JobObjects for Storage {
    async fn fetch(&self, key: &str, destination: &Path) -> Result<bool, BoxError> {
        let Some(object) = self.get(key).await? else { return Ok(false) };
        let mut file = tokio::fs::File::create(destination).await?;
        let mut body = object.body;
        while let Some(chunk) = body.next().await {
            file.write_all(&chunk?).await?;
        }
        file.flush().await?;
        Ok(true)
    }

    async fn store_file(&self, key: &str, path: &Path) -> Result<(), BoxError> {
        Ok(self.put_file(key, path).await?)
    }

    async fn store_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BoxError> {
        Ok(self.put_bytes(key, bytes).await?)
    }

    fn shared(&self) -> Option<&Storage> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl JobObjects for JobAccess {
    async fn fetch(&self, key: &str, destination: &Path) -> Result<bool, BoxError> {
        Ok(self.download(key, destination).await?)
    }

    async fn store_file(&self, key: &str, path: &Path) -> Result<(), BoxError> {
        Ok(self.put_file(key, path).await?)
    }

    async fn store_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BoxError> {
        Ok(self.put_bytes(key, bytes).await?)
    }

    fn shared(&self) -> Option<&Storage> {
        None
    }
}

pub(super) async fn download(storage: &dyn JobObjects, key: &str, destination: &Path) -> Result<bool, Error> {
    storage.fetch(key, destination).await.map_err(|source| Error::Download { key: key.to_string(), source })
}
