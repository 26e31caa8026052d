//! Job-scoped access to object storage: the presigned URLs of one job's objects (read its
//! artifact and arguments, write its result, logs and exit record), handed to its pod in the
//! job's Secret. User code runs beside the launcher, so the pod never holds storage credentials;
//! at worst it can overwrite its own job's outputs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::{Storage, keys};
use crate::http::{HttpBody, HttpClient, empty, http_client};
use crate::shared::BoxError;

/// The presigned URLs of one job, by object key. Serialized into the job's Secret.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAccess {
    /// Object key → URL to read it.
    pub read: BTreeMap<String, String>,
    /// Object key → URL to write it.
    pub write: BTreeMap<String, String>,
}

impl std::fmt::Debug for JobAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobAccess").field("read", &self.read.keys()).field("write", &self.write.keys()).finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no access to object {key} was given to this job")]
    NotGiven { key: String },
    #[error("failed to {operation} object {key}: {detail}")]
    Transfer { operation: &'static str, key: String, detail: String },
    #[error("failed to use the local file {path}")]
    File { path: String, source: std::io::Error },
}

impl JobAccess {
    /// Presigns every object of `job_id` its launcher uses, valid for `expires_in`.
    pub async fn presign(
        storage: &Storage,
        job_id: &str,
        artifact: Option<&str>,
        expires_in: Duration,
    ) -> Result<JobAccess, super::Error> {
        let mut access = JobAccess::default();
        let mut reads = vec![keys::job_arguments(job_id)];
        reads.extend(artifact.map(str::to_string));
        for key in reads {
            let url = storage.presign(&key, false, expires_in).await?;
            access.read.insert(key, url);
        }
        for key in [
            keys::job_result(job_id),
            keys::job_user_log(job_id),
            keys::job_provider_log(job_id),
            keys::job_exit(job_id),
        ] {
            let url = storage.presign(&key, true, expires_in).await?;
            access.write.insert(key, url);
        }
        Ok(access)
    }

    fn client() -> Result<HttpClient, String> {
        http_client()
    }

    /// Streams the object `key` into `destination`; false when it does not exist.
    pub async fn download(&self, key: &str, destination: &Path) -> Result<bool, Error> {
        let url = self.read.get(key).ok_or_else(|| Error::NotGiven { key: key.into() })?;
        let transfer = |detail: String| Error::Transfer { operation: "read", key: key.into(), detail };
        let request = hyper::Request::get(url.as_str()).body(empty()).map_err(|e| transfer(e.to_string()))?;
        let response = Self::client().map_err(transfer)?.request(request).await.map_err(|e| transfer(e.to_string()))?;
        match response.status().as_u16() {
            200 => {}
            404 => return Ok(false),
            status => return Err(transfer(format!("HTTP {status}"))),
        }
        let file_error = |source| Error::File { path: destination.display().to_string(), source };
        let mut file = tokio::fs::File::create(destination).await.map_err(file_error)?;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| transfer(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                file.write_all(&data).await.map_err(file_error)?;
            }
        }
        file.flush().await.map_err(file_error)?;
        Ok(true)
    }

    /// Replaces the object `key` with `body` of `length` bytes.
    async fn upload(&self, key: &str, body: HttpBody, length: u64) -> Result<(), Error> {
        let url = self.write.get(key).ok_or_else(|| Error::NotGiven { key: key.into() })?;
        let transfer = |detail: String| Error::Transfer { operation: "write", key: key.into(), detail };
        let request = hyper::Request::put(url.as_str())
            .header(hyper::header::CONTENT_LENGTH, length)
            .body(body)
            .map_err(|e| transfer(e.to_string()))?;
        let response = Self::client().map_err(transfer)?.request(request).await.map_err(|e| transfer(e.to_string()))?;
        if !response.status().is_success() {
            return Err(transfer(format!("HTTP {}", response.status().as_u16())));
        }
        Ok(())
    }

    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), Error> {
        let length = bytes.len() as u64;
        self.upload(key, Full::new(bytes).map_err(|never| match never {}).boxed(), length).await
    }

    /// Streams the local file `path` into the object `key`.
    pub async fn put_file(&self, key: &str, path: &Path) -> Result<(), Error> {
        let file_error = |source| Error::File { path: path.display().to_string(), source };
        let file = tokio::fs::File::open(path).await.map_err(file_error)?;
        let length = file.metadata().await.map_err(file_error)?.len();
        let stream = tokio_util::io::ReaderStream::with_capacity(file, super::CHUNK_BYTES).map_ok(Frame::data);
        let body = StreamBody::new(stream.map_err(|e| Box::new(e) as BoxError)).boxed();
        self.upload(key, body, length).await
    }
}
