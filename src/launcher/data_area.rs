//! A job's file area (`DATA_PATH`) when the job's folder is not the area itself: the launcher
//! copies the area's files in before the function runs, then copies back what the function
//! added, changed or removed there, every few seconds while it runs (so `files()` shows a file
//! soon after the job writes it) and once more at its end. The area lives either in the shared
//! storage (`gantry serve` with S3: the launcher holds the storage) or behind the gateway's files
//! API (a pod: the job's own token reaches exactly the caller's files, no storage credentials).
//! Only regular files directly in the folder take part, as the files API lists them.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::io::AsyncWriteExt;

use super::objects::JobObjects;
use crate::http::{self, HttpBody, HttpClient};
use crate::secrets::Secret;
use crate::shared::BoxError;
use crate::storage::Storage;

/// How often the running job's changes are copied back.
pub const SYNC_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to create {path}")]
    Folder { path: PathBuf, source: io::Error },
    #[error("failed to list the user's files in {area}")]
    List { area: String, source: BoxError },
    #[error("failed to read the user's files in {path}")]
    Read { path: PathBuf, source: io::Error },
    #[error("failed to copy {name} from {area}")]
    Fetch { name: String, area: String, source: BoxError },
    #[error("failed to copy {name} back to {area}")]
    Store { name: String, area: String, source: BoxError },
    #[error("failed to remove {name} from {area}")]
    Remove { name: String, area: String, source: BoxError },
}

/// Where the area is kept.
#[async_trait::async_trait]
pub trait Area: Send + Sync {
    /// Where, in words (for errors).
    fn name(&self) -> String;
    async fn list(&self) -> Result<Vec<String>, BoxError>;
    /// Copies the file `name` to `destination`; false when there is no such file.
    async fn fetch(&self, name: &str, destination: &Path) -> Result<bool, BoxError>;
    async fn store(&self, name: &str, path: &Path) -> Result<(), BoxError>;
    async fn remove(&self, name: &str) -> Result<(), BoxError>;
}

/// The area as a folder of object keys in the shared storage.
pub struct StorageArea {
    pub storage: Storage,
    /// Ends with `/`.
    pub key: String,
}

#[async_trait::async_trait]
impl Area for StorageArea {
    fn name(&self) -> String {
        self.key.clone()
    }

    async fn list(&self) -> Result<Vec<String>, BoxError> {
        Ok(self.storage.list(&self.key).await?)
    }

    async fn fetch(&self, name: &str, destination: &Path) -> Result<bool, BoxError> {
        JobObjects::fetch(&self.storage, &format!("{}{name}", self.key), destination).await
    }

    async fn store(&self, name: &str, path: &Path) -> Result<(), BoxError> {
        Ok(self.storage.put_file(&format!("{}{name}", self.key), path).await?)
    }

    async fn remove(&self, name: &str) -> Result<(), BoxError> {
        self.storage.delete(&format!("{}{name}", self.key)).await?;
        Ok(())
    }
}

/// The area behind the gateway's files API, reached with the job's token (`files/`,
/// `files/download/`, `files/upload/`, `files/delete/` of the job's function).
pub struct GatewayArea {
    /// The gateway's base URL (`ENV_JOB_GATEWAY_HOST`).
    pub base: String,
    pub token: Secret,
    pub function: String,
    pub provider: Option<String>,
    /// The caller's channel and instance (`QISKIT_IBM_CHANNEL`, `ENV_JOB_GATEWAY_INSTANCE`),
    /// sent as the client sends them, so the gateway authenticates the job as its caller.
    pub channel: Option<String>,
    pub instance: Option<String>,
    /// One client for the job's life (the periodic sync would otherwise load the system's
    /// root certificates every few seconds).
    client: std::sync::OnceLock<HttpClient>,
}

fn http_error(what: &str, status: u16, body: &[u8]) -> BoxError {
    format!("{what}: HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)]).trim()).into()
}

impl GatewayArea {
    /// From the job's environment (the gateway's address and the caller's token), for the
    /// function `function` of `provider`.
    pub fn from_environment(
        environment: &[(OsString, OsString)],
        function: &str,
        provider: Option<&str>,
    ) -> Option<GatewayArea> {
        let variable = |name: &str| {
            environment
                .iter()
                .find(|(key, value)| key == name && !value.is_empty())
                .map(|(_, value)| value.to_string_lossy().into_owned())
        };
        Some(GatewayArea {
            base: variable("ENV_JOB_GATEWAY_HOST")?.trim_end_matches('/').to_string(),
            token: Secret::new(variable("ENV_JOB_GATEWAY_TOKEN")?),
            function: function.to_string(),
            provider: provider.map(str::to_string),
            channel: variable("QISKIT_IBM_CHANNEL"),
            instance: variable("ENV_JOB_GATEWAY_INSTANCE"),
            client: std::sync::OnceLock::new(),
        })
    }

    fn url(&self, path: &str, file: Option<&str>) -> String {
        let mut query = vec![("function", self.function.as_str())];
        query.extend(self.provider.as_deref().map(|provider| ("provider", provider)));
        query.extend(file.map(|file| ("file", file)));
        let query = serde_urlencoded::to_string(&query).unwrap_or_default();
        format!("{}/api/v1/files/{path}?{query}", self.base)
    }

    async fn send(
        &self,
        request: hyper::http::request::Builder,
        body: HttpBody,
    ) -> Result<hyper::Response<hyper::body::Incoming>, BoxError> {
        let mut request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {}", self.token.expose()));
        if let Some(channel) = &self.channel {
            request = request.header("Service-Channel", channel);
        }
        if let Some(instance) = &self.instance {
            request = request.header("Service-CRN", instance);
        }
        let request = request.body(body)?;
        let client = match self.client.get() {
            Some(client) => client,
            None => {
                let client = http::http_client()?;
                self.client.get_or_init(|| client)
            }
        };
        Ok(client.request(request).await?)
    }

    async fn read_body(response: hyper::Response<hyper::body::Incoming>) -> Result<Bytes, BoxError> {
        Ok(response.into_body().collect().await?.to_bytes())
    }
}

#[async_trait::async_trait]
impl Area for GatewayArea {
    fn name(&self) -> String {
        format!("the files of {} (gateway files API)", self.function)
    }

    async fn list(&self) -> Result<Vec<String>, BoxError> {
        let response = self.send(hyper::Request::get(self.url("", None)), http::empty()).await?;
        let status = response.status().as_u16();
        let body = Self::read_body(response).await?;
        if status != 200 {
            return Err(http_error("listing", status, &body));
        }
        let listing: serde_json::Value = serde_json::from_slice(&body)?;
        Ok(listing["results"]
            .as_array()
            .ok_or("the listing has no results")?
            .iter()
            .filter_map(|name| name.as_str().map(str::to_string))
            .collect())
    }

    async fn fetch(&self, name: &str, destination: &Path) -> Result<bool, BoxError> {
        let response = self.send(hyper::Request::get(self.url("download/", Some(name))), http::empty()).await?;
        match response.status().as_u16() {
            200 => {}
            404 => return Ok(false),
            status => return Err(http_error("downloading", status, &Self::read_body(response).await?)),
        }
        let mut file = tokio::fs::File::create(destination).await?;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                file.write_all(&data).await?;
            }
        }
        file.flush().await?;
        Ok(true)
    }

    async fn store(&self, name: &str, path: &Path) -> Result<(), BoxError> {
        let boundary = format!("gantry-{}", uuid::Uuid::new_v4().simple());
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        );
        let tail = format!("\r\n--{boundary}--\r\n");
        let file = tokio::fs::File::open(path).await?;
        let length = file.metadata().await?.len() + (head.len() + tail.len()) as u64;
        let content = tokio_util::io::ReaderStream::new(file).map_err(|e| Box::new(e) as BoxError);
        let parts = futures::stream::once(async move { Ok::<_, BoxError>(Bytes::from(head)) })
            .chain(content)
            .chain(futures::stream::once(async move { Ok(Bytes::from(tail)) }))
            .map_ok(Frame::data);
        let request = hyper::Request::post(self.url("upload/", None))
            .header(hyper::header::CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
            .header(hyper::header::CONTENT_LENGTH, length);
        let response = self.send(request, BodyExt::boxed(StreamBody::new(parts))).await?;
        let status = response.status().as_u16();
        let body = Self::read_body(response).await?;
        if status != 200 {
            return Err(http_error("uploading", status, &body));
        }
        Ok(())
    }

    async fn remove(&self, name: &str) -> Result<(), BoxError> {
        let response = self.send(hyper::Request::delete(self.url("delete/", Some(name))), http::empty()).await?;
        let status = response.status().as_u16();
        let body = Self::read_body(response).await?;
        match status {
            200 | 404 => Ok(()),
            _ => Err(http_error("removing", status, &body)),
        }
    }
}

/// What the folder held, by name: size and modification time.
type Snapshot = HashMap<String, (u64, SystemTime)>;

/// A plain name of a file directly in the area: what the files API can address.
fn is_area_name(name: &str) -> bool {
    crate::domain::names::sanitize_file_name(name).as_deref() == Some(name)
}

/// Regular files directly in `folder` (links and folders are left out, so a job cannot make the
/// launcher upload what a link points to), with their size and modification time.
async fn files_in(folder: &Path) -> Result<Snapshot, Error> {
    let read_error = |source| Error::Read { path: folder.to_path_buf(), source };
    let mut files = Snapshot::new();
    let mut entries = tokio::fs::read_dir(folder).await.map_err(read_error)?;
    while let Some(entry) = entries.next_entry().await.map_err(read_error)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let metadata = tokio::fs::symlink_metadata(entry.path()).await.map_err(read_error)?;
        if metadata.is_file() && is_area_name(&name) {
            files.insert(name, (metadata.len(), metadata.modified().map_err(read_error)?));
        }
    }
    Ok(files)
}

/// The area mirrored into a job's folder.
pub struct Mirror {
    area: Box<dyn Area>,
    folder: PathBuf,
    /// What the area holds as far as this mirror knows (as last copied either way).
    known: tokio::sync::Mutex<Snapshot>,
    /// A folder of the launcher's own where files are copied, without following links, before
    /// they are sent (an isolated job could swap a file for a link to one of the server's).
    outbox: Option<PathBuf>,
}

impl Mirror {
    /// Copies the area's files into `folder`.
    pub async fn pull(area: Box<dyn Area>, folder: &Path) -> Result<Mirror, Error> {
        tokio::fs::create_dir_all(folder)
            .await
            .map_err(|source| Error::Folder { path: folder.to_path_buf(), source })?;
        let names = area.list().await.map_err(|source| Error::List { area: area.name(), source })?;
        for name in names.iter().filter(|name| is_area_name(name)) {
            // A file deleted since the listing is simply not there.
            area.fetch(name, &folder.join(name)).await.map_err(|source| Error::Fetch {
                name: name.clone(),
                area: area.name(),
                source,
            })?;
        }
        let known = tokio::sync::Mutex::new(files_in(folder).await?);
        Ok(Mirror { area, folder: folder.to_path_buf(), known, outbox: None })
    }

    /// Sends files through `outbox` (see `Mirror::outbox`).
    pub fn stage_through(self, outbox: PathBuf) -> Mirror {
        Mirror { outbox: Some(outbox), ..self }
    }

    /// The file to send for `name`: the folder's own, or its copy in the outbox.
    async fn source(&self, name: &str) -> Result<PathBuf, BoxError> {
        let Some(outbox) = &self.outbox else { return Ok(self.folder.join(name)) };
        let (folder, outbox, name) = (self.folder.clone(), outbox.clone(), name.to_string());
        let copy = tokio::task::spawn_blocking(move || -> io::Result<PathBuf> {
            std::fs::create_dir_all(&outbox)?;
            let mut source = super::isolation::open_beneath(&folder, Path::new(&name))?;
            let copy = outbox.join(&name);
            io::copy(&mut source, &mut std::fs::File::create(&copy)?)?;
            Ok(copy)
        })
        .await??;
        Ok(copy)
    }

    /// Copies back what changed in the folder since the last copy, and removes what was deleted
    /// there. What fails is tried again on the next sync.
    pub async fn sync(&self) -> Vec<Error> {
        let mut known = self.known.lock().await;
        let now = match files_in(&self.folder).await {
            Ok(now) => now,
            Err(error) => return vec![error],
        };
        let mut problems = Vec::new();
        for (name, state) in &now {
            if known.get(name) != Some(state) {
                let stored = match self.source(name).await {
                    Ok(source) => self.area.store(name, &source).await,
                    Err(error) => Err(error),
                };
                match stored {
                    Ok(()) => {
                        known.insert(name.clone(), *state);
                    }
                    Err(source) => problems.push(Error::Store { name: name.clone(), area: self.area.name(), source }),
                }
            }
        }
        let removed: Vec<String> = known.keys().filter(|name| !now.contains_key(*name)).cloned().collect();
        for name in removed {
            match self.area.remove(&name).await {
                Ok(()) => {
                    known.remove(&name);
                }
                Err(source) => problems.push(Error::Remove { name, area: self.area.name(), source }),
            }
        }
        problems
    }

    /// Syncs every `SYNC_EVERY` until dropped; problems are reported and retried.
    pub async fn keep_syncing(&self) {
        loop {
            tokio::time::sleep(SYNC_EVERY).await;
            for problem in self.sync().await {
                say!("gantry launch: {} (will retry)", crate::shared::describe(&problem));
            }
        }
    }
}
