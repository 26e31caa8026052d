//! Object storage for artifacts, user files, provider files (and, later, job arguments, results
//! and logs): a local directory (embedded default) or an S3-compatible bucket. Object keys come
//! from the pure functions in `keys`, which only ever see sanitized names. Transfers stream: an
//! upload is first spooled to a temporary file by the API layer and then moved in (renamed into
//! a local directory, sent to S3 in parts when large); a download is read in large chunks (see
//! `transfer`).

pub mod access;
pub mod keys;
pub mod migrate;
pub mod refusal;
pub mod transfer;

use std::io;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;

use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use futures::{Stream, TryStreamExt};

use self::refusal::s3_sdk_error;

/// Chunk size of streamed downloads.
pub const CHUNK_BYTES: usize = 64 * 1024;

pub type ObjectStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// An object found by `list_tree`: its key and when it was last written (microseconds since the
/// Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub modified: i64,
}

/// An object opened for reading.
pub struct Object {
    pub size: u64,
    pub body: ObjectStream,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to {operation} object {key} in local storage")]
    Local { operation: &'static str, key: String, source: io::Error },
    /// `failure`: what the store said, when it was asked (see `refusal`).
    #[error("failed to {operation} object {key} in bucket {bucket}")]
    S3 {
        operation: &'static str,
        bucket: String,
        key: String,
        failure: Option<Box<refusal::S3Failure>>,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("refusing unsafe object key {key}")]
    UnsafeKey { key: String },
    #[error("invalid storage location {location}: use a directory path or s3://bucket[/prefix]")]
    Location { location: String },
}

impl Error {
    /// Whether a folder holds the object's name in local storage (a job can make one in its
    /// user's area): the object cannot be written there.
    pub fn is_folder_in_the_way(&self) -> bool {
        matches!(self, Error::Local { source, .. } if source.kind() == io::ErrorKind::IsADirectory)
    }
}

/// The S3 connection settings.
#[derive(Clone)]
pub struct S3Settings {
    pub bucket: String,
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub path_style: bool,
    /// Longest wait for a connection, and for the first byte of each answer: a store that
    /// stops answering fails the request (retried by the SDK, then named) instead of holding it.
    pub timeout: std::time::Duration,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .finish_non_exhaustive()
    }
}

/// Where objects are kept. On S3, objects larger than `part_bytes` go up as multipart uploads
/// in parts of that size.
#[derive(Clone, Debug)]
pub enum Storage {
    Local { root: PathBuf },
    S3 { client: aws_sdk_s3::Client, bucket: String, prefix: String, part_bytes: u64 },
}

impl Storage {
    pub fn local(root: impl Into<PathBuf>) -> Storage {
        Storage::Local { root: root.into() }
    }

    pub fn s3(settings: &S3Settings) -> Storage {
        let credentials = aws_credential_types::Credentials::from_keys(
            settings.access_key_id.clone(),
            settings.secret_access_key.clone(),
            None,
        );
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new(settings.region.clone()))
            .credentials_provider(credentials)
            .force_path_style(settings.path_style)
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(settings.timeout)
                    .read_timeout(settings.timeout)
                    .build(),
            );
        if let Some(endpoint) = &settings.endpoint {
            config = config.endpoint_url(endpoint);
        }
        let prefix = settings.prefix.trim_matches('/');
        Storage::S3 {
            client: aws_sdk_s3::Client::from_conf(config.build()),
            bucket: settings.bucket.clone(),
            prefix: if prefix.is_empty() { String::new() } else { format!("{prefix}/") },
            part_bytes: transfer::DEFAULT_PART_BYTES,
        }
    }

    /// Sets the part size of S3 multipart uploads (at least S3's 5 MiB); no effect on local
    /// storage.
    pub fn with_part_size(mut self, bytes: u64) -> Storage {
        if let Storage::S3 { part_bytes, .. } = &mut self {
            *part_bytes = bytes.max(transfer::MIN_PART_BYTES);
        }
        self
    }

    /// Splits `s3://bucket/prefix` into bucket and prefix.
    pub fn parse_s3_location(location: &str) -> Result<(String, String), Error> {
        let rest = location.strip_prefix("s3://").ok_or_else(|| Error::Location { location: location.into() })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::Location { location: location.into() });
        }
        Ok((bucket.to_string(), prefix.to_string()))
    }

    pub fn backend_name(&self) -> String {
        match self {
            Storage::Local { root } => format!("local directory {}", root.display()),
            Storage::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}"),
        }
    }

    fn local_path(root: &Path, key: &str) -> Result<PathBuf, Error> {
        let relative = Path::new(key);
        let safe = !key.is_empty() && relative.components().all(|c| matches!(c, Component::Normal(_)));
        if !safe || key.contains('\0') {
            return Err(Error::UnsafeKey { key: key.into() });
        }
        Ok(root.join(relative))
    }

    /// Checks that the storage answers (readiness).
    pub async fn check(&self) -> Result<(), Error> {
        match self {
            Storage::Local { root } => tokio::fs::create_dir_all(root).await.map_err(|source| Error::Local {
                operation: "open",
                key: root.display().to_string(),
                source,
            }),
            Storage::S3 { client, bucket, .. } => client
                .head_bucket()
                .bucket(bucket)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| s3_sdk_error("reach", bucket, "", e)),
        }
    }

    /// Moves a finished local file (the spooled upload) into the object `key`, replacing it.
    /// The object appears whole or not at all.
    pub async fn put_file(&self, key: &str, file: &Path) -> Result<(), Error> {
        match self {
            Storage::Local { root } => {
                let local_error = |operation, source| Error::Local { operation, key: key.to_string(), source };
                let destination = Self::local_path(root, key)?;
                let parent = destination.parent().expect("object paths have a parent");
                tokio::fs::create_dir_all(parent).await.map_err(|e| local_error("create folder for", e))?;
                crate::shared::replace_file(&destination, crate::shared::Contents::CopyOf(file), None)
                    .await
                    .map_err(|e| local_error("store", e))
            }
            Storage::S3 { client, bucket, prefix, part_bytes } => {
                let size =
                    tokio::fs::metadata(file).await.map_err(|e| s3_error("read upload for", bucket, key, e))?.len();
                if size > *part_bytes {
                    let upload = transfer::MultipartUpload {
                        client: client.clone(),
                        bucket: bucket.clone(),
                        full_key: format!("{prefix}{key}"),
                        key: key.to_string(),
                        path: file.to_path_buf(),
                        size,
                        part_bytes: *part_bytes,
                    };
                    return upload.send().await;
                }
                let body = ByteStream::read_from()
                    .path(file)
                    .buffer_size(transfer::READ_CHUNK_BYTES)
                    .build()
                    .await
                    .map_err(|e| s3_error("read upload for", bucket, key, e))?;
                client
                    .put_object()
                    .bucket(bucket)
                    .key(format!("{prefix}{key}"))
                    .body(body)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| s3_sdk_error("write", bucket, key, e))
            }
        }
    }

    /// Moves a spooled upload into the object `key`, replacing it: renamed into place on local
    /// storage (copied when the spool lies on another file system), sent on S3. The object
    /// appears whole or not at all.
    pub async fn put_spooled(&self, key: &str, spool: tempfile::TempPath) -> Result<(), Error> {
        let Storage::Local { root } = self else { return self.put_file(key, &spool).await };
        let local_error = |operation, source| Error::Local { operation, key: key.to_string(), source };
        let destination = Self::local_path(root, key)?;
        let parent = destination.parent().expect("object paths have a parent");
        tokio::fs::create_dir_all(parent).await.map_err(|e| local_error("create folder for", e))?;
        match transfer::move_local(&spool, &destination).await.map_err(|e| local_error("store", e))? {
            transfer::Moved::Renamed => {
                // Nothing is left to remove, and a later spool file of the same name is another
                // upload's.
                let _ = spool.keep();
                Ok(())
            }
            transfer::Moved::Exchanged => {
                // The replaced file, now at the spool's name, is removed after the answer (freeing
                // a large file's pages takes milliseconds); a crash before leaves it to the spool's
                // clean-up at a later start.
                tokio::task::spawn_blocking(move || drop(spool));
                Ok(())
            }
            transfer::Moved::OtherFileSystem => self.put_file(key, &spool).await,
        }
    }

    /// Stores a small object from memory.
    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), Error> {
        match self {
            Storage::Local { root } => {
                let local_error = |operation, source| Error::Local { operation, key: key.to_string(), source };
                let destination = Self::local_path(root, key)?;
                let parent = destination.parent().expect("object paths have a parent");
                tokio::fs::create_dir_all(parent).await.map_err(|e| local_error("create folder for", e))?;
                crate::shared::replace_file(&destination, crate::shared::Contents::Bytes(&bytes), None)
                    .await
                    .map_err(|e| local_error("store", e))
            }
            Storage::S3 { client, bucket, prefix, .. } => client
                .put_object()
                .bucket(bucket)
                .key(format!("{prefix}{key}"))
                .body(ByteStream::from(bytes))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| s3_sdk_error("write", bucket, key, e)),
        }
    }

    /// Opens an object for streaming, `None` when it does not exist.
    pub async fn get(&self, key: &str) -> Result<Option<Object>, Error> {
        match self {
            Storage::Local { root } => {
                let path = Self::local_path(root, key)?;
                let file = match tokio::fs::File::open(&path).await {
                    Ok(file) => file,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(source) => {
                        return Err(Error::Local { operation: "open", key: key.into(), source });
                    }
                };
                let metadata = file.metadata().await.map_err(|source| Error::Local {
                    operation: "inspect",
                    key: key.into(),
                    source,
                })?;
                if !metadata.is_file() {
                    return Ok(None);
                }
                let size = metadata.len();
                Ok(Some(Object { size, body: transfer::local_file_stream(file.into_std().await, size) }))
            }
            Storage::S3 { client, bucket, prefix, .. } => {
                let response = client.get_object().bucket(bucket).key(format!("{prefix}{key}")).send().await;
                match response {
                    Ok(output) => {
                        let size = output.content_length().unwrap_or_default().max(0) as u64;
                        Ok(Some(Object { size, body: transfer::s3_body_stream(output.body) }))
                    }
                    Err(error) if error.as_service_error().is_some_and(|e| e.is_no_such_key()) => Ok(None),
                    Err(error) => Err(s3_sdk_error("read", bucket, key, error)),
                }
            }
        }
    }

    /// Reads a whole (small) object into memory.
    pub async fn read_to_bytes(&self, key: &str) -> Result<Option<Bytes>, Error> {
        let Some(object) = self.get(key).await? else {
            return Ok(None);
        };
        let chunks: Vec<Bytes> = object.body.try_collect().await.map_err(|source| Error::Local {
            operation: "read",
            key: key.into(),
            source,
        })?;
        Ok(Some(chunks.concat().into()))
    }

    /// Names of the objects directly under `prefix` (which ends with `/`), sorted; sub-folders
    /// are not listed.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let mut names = Vec::new();
        match self {
            Storage::Local { root } => {
                let folder = Self::local_path(root, prefix.trim_end_matches('/'))?;
                let mut entries = match tokio::fs::read_dir(&folder).await {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(names),
                    Err(source) => {
                        return Err(Error::Local { operation: "list", key: prefix.into(), source });
                    }
                };
                while let Some(entry) = entries.next_entry().await.map_err(|source| Error::Local {
                    operation: "list",
                    key: prefix.into(),
                    source,
                })? {
                    let is_file = entry.file_type().await.map(|t| t.is_file()).unwrap_or(false);
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if is_file && !name.starts_with(".incoming-") {
                        names.push(name);
                    }
                }
            }
            Storage::S3 { client, bucket, prefix: root, .. } => {
                let full = format!("{root}{prefix}");
                let mut pages =
                    client.list_objects_v2().bucket(bucket).prefix(&full).delimiter("/").into_paginator().send();
                while let Some(page) = pages.next().await {
                    let page = page.map_err(|e| s3_sdk_error("list", bucket, prefix, e))?;
                    for object in page.contents() {
                        if let Some(name) = object.key().and_then(|k| k.strip_prefix(&full))
                            && !name.is_empty()
                            && !name.contains('/')
                        {
                            names.push(name.to_string());
                        }
                    }
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Deletes an object; false when there was none.
    pub async fn delete(&self, key: &str) -> Result<bool, Error> {
        match self {
            Storage::Local { root } => {
                let path = Self::local_path(root, key)?;
                match tokio::fs::metadata(&path).await {
                    Ok(metadata) if metadata.is_file() => {}
                    Ok(_) => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                    Err(source) => {
                        return Err(Error::Local { operation: "inspect", key: key.into(), source });
                    }
                }
                tokio::fs::remove_file(&path).await.map(|_| true).map_err(|source| Error::Local {
                    operation: "delete",
                    key: key.into(),
                    source,
                })
            }
            Storage::S3 { client, bucket, prefix, .. } => {
                let full = format!("{prefix}{key}");
                match client.head_object().bucket(bucket).key(&full).send().await {
                    Ok(_) => {}
                    Err(error) if error.as_service_error().is_some_and(|e| e.is_not_found()) => {
                        return Ok(false);
                    }
                    Err(error) => return Err(s3_sdk_error("inspect", bucket, key, error)),
                }
                client
                    .delete_object()
                    .bucket(bucket)
                    .key(&full)
                    .send()
                    .await
                    .map(|_| true)
                    .map_err(|e| s3_sdk_error("delete", bucket, key, e))
            }
        }
    }
}

impl Storage {
    /// A URL that lets its holder, and nobody else, read (`write` false) or replace (`write`
    /// true) the one object `key` until `expires_in` has passed: how a job pod reaches its own
    /// objects without storage credentials. S3 only.
    pub async fn presign(&self, key: &str, write: bool, expires_in: std::time::Duration) -> Result<String, Error> {
        let Storage::S3 { client, bucket, prefix, .. } = self else {
            return Err(Error::Location { location: "presigned URLs need S3 storage".into() });
        };
        let config = aws_sdk_s3::presigning::PresigningConfig::expires_in(expires_in)
            .map_err(|e| s3_error("presign", bucket, key, e))?;
        let full = format!("{prefix}{key}");
        let request = match write {
            false => client
                .get_object()
                .bucket(bucket)
                .key(&full)
                .presigned(config)
                .await
                .map_err(|e| s3_error("presign", bucket, key, e)),
            true => client
                .put_object()
                .bucket(bucket)
                .key(&full)
                .presigned(config)
                .await
                .map_err(|e| s3_error("presign", bucket, key, e)),
        };
        request.map(|r| r.uri().to_string())
    }

    /// Every object under `prefix` (ending with `/`), at any depth, with its write time; staged
    /// partial uploads are left out. Symbolic links are not followed.
    pub async fn list_tree(&self, prefix: &str) -> Result<Vec<ObjectInfo>, Error> {
        match self {
            Storage::Local { root } => {
                let start = Self::local_path(root, prefix.trim_end_matches('/'))?;
                let root = root.clone();
                let prefix = prefix.to_string();
                tokio::task::spawn_blocking(move || walk_local(&root, &start))
                    .await
                    .map_err(|e| Error::Local { operation: "list", key: prefix.clone(), source: io::Error::other(e) })?
                    .map_err(|source| Error::Local { operation: "list", key: prefix, source })
            }
            Storage::S3 { client, bucket, prefix: root, .. } => {
                let full = format!("{root}{prefix}");
                let mut objects = Vec::new();
                let mut pages = client.list_objects_v2().bucket(bucket).prefix(&full).into_paginator().send();
                while let Some(page) = pages.next().await {
                    let page = page.map_err(|e| s3_sdk_error("list", bucket, prefix, e))?;
                    for object in page.contents() {
                        let Some(key) = object.key().and_then(|k| k.strip_prefix(root.as_str())) else { continue };
                        let modified = object.last_modified().and_then(|t| t.to_millis().ok()).unwrap_or_default();
                        objects.push(ObjectInfo { key: key.to_string(), modified: modified.saturating_mul(1000) });
                    }
                }
                objects.sort_by(|a, b| a.key.cmp(&b.key));
                Ok(objects)
            }
        }
    }

    /// Deletes every object under `prefix` (ending with `/`), at any depth, and returns how many
    /// there were. Nothing there is not an error, so a deletion cut short can simply be repeated.
    /// On local storage the folder goes too, with any partial upload staged in it.
    pub async fn delete_tree(&self, prefix: &str) -> Result<u64, Error> {
        let objects = self.list_tree(prefix).await?;
        match self {
            Storage::Local { root } => {
                let folder = Self::local_path(root, prefix.trim_end_matches('/'))?;
                match tokio::fs::remove_dir_all(&folder).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(source) => return Err(Error::Local { operation: "delete", key: prefix.into(), source }),
                }
            }
            Storage::S3 { client, bucket, prefix: root, .. } => {
                use aws_sdk_s3::types::{Delete, ObjectIdentifier};
                // One request deletes at most 1,000 keys.
                for chunk in objects.chunks(1000) {
                    let identifiers = chunk
                        .iter()
                        .map(|object| ObjectIdentifier::builder().key(format!("{root}{}", object.key)).build())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| s3_error("delete", bucket, prefix, e))?;
                    let delete = Delete::builder()
                        .set_objects(Some(identifiers))
                        .quiet(true)
                        .build()
                        .map_err(|e| s3_error("delete", bucket, prefix, e))?;
                    let output = client
                        .delete_objects()
                        .bucket(bucket)
                        .delete(delete)
                        .send()
                        .await
                        .map_err(|e| s3_sdk_error("delete", bucket, prefix, e))?;
                    if let Some(failure) = output.errors().first() {
                        let key = failure.key().and_then(|k| k.strip_prefix(root.as_str())).unwrap_or(prefix);
                        let message = format!(
                            "{}: {}",
                            failure.code().unwrap_or("error"),
                            failure.message().unwrap_or("no message")
                        );
                        return Err(s3_error("delete", bucket, key, io::Error::other(message)));
                    }
                }
            }
        }
        Ok(objects.len() as u64)
    }

    /// Moves the object `from` to `to`, replacing `to`.
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), Error> {
        match self {
            Storage::Local { root } => {
                let local_error = |operation, source| Error::Local { operation, key: from.to_string(), source };
                let source = Self::local_path(root, from)?;
                let destination = Self::local_path(root, to)?;
                let parent = destination.parent().expect("object paths have a parent");
                tokio::fs::create_dir_all(parent).await.map_err(|e| local_error("create folder for", e))?;
                tokio::fs::rename(&source, &destination).await.map_err(|e| local_error("move", e))
            }
            Storage::S3 { client, bucket, prefix, .. } => {
                client
                    .copy_object()
                    .bucket(bucket)
                    .copy_source(format!("{bucket}/{prefix}{from}"))
                    .key(format!("{prefix}{to}"))
                    .send()
                    .await
                    .map_err(|e| s3_sdk_error("copy", bucket, from, e))?;
                client
                    .delete_object()
                    .bucket(bucket)
                    .key(format!("{prefix}{from}"))
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| s3_sdk_error("delete", bucket, from, e))
            }
        }
    }

    /// Removes the empty folders under `prefix` left behind by moves (local storage only; S3
    /// has no folders).
    pub async fn prune_empty_folders(&self, prefix: &str) -> Result<(), Error> {
        let Storage::Local { root } = self else { return Ok(()) };
        let start = Self::local_path(root, prefix.trim_end_matches('/'))?;
        tokio::task::spawn_blocking(move || prune_local(&start)).await.map_err(|e| Error::Local {
            operation: "prune",
            key: prefix.into(),
            source: io::Error::other(e),
        })?;
        Ok(())
    }
}

/// Where objects are stored.
#[derive(Debug, Clone, clap::Args)]
pub struct StorageArgs {
    /// Object storage: a directory, or s3://BUCKET[/PREFIX]. Default: DATA_DIR/objects.
    #[arg(long, env = "GANTRY_STORAGE")]
    pub storage: Option<String>,
    /// S3 endpoint URL (MinIO, Ceph, ...); default: AWS for the region.
    #[arg(long, env = "GANTRY_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, env = "GANTRY_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    /// S3 access key id.
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,
    /// S3 secret access key.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<crate::secrets::Secret>,
    /// Address buckets by path (`endpoint/bucket/key`) instead of virtual host; MinIO needs it.
    #[arg(long, env = "GANTRY_S3_PATH_STYLE")]
    pub s3_path_style: bool,
    /// Seconds to wait for a connection to the S3 store, and for the first byte of each of its
    /// answers (a large upload's parts included), before the request fails and is retried.
    #[arg(long, env = "GANTRY_S3_TIMEOUT_SECONDS", default_value_t = 60)]
    pub s3_timeout_seconds: u64,
    /// Files larger than this (MiB) go to S3 as multipart uploads in parts of this size, a few
    /// parts at once (at least 5, the S3 minimum; larger parts where a file would need more than
    /// 10,000).
    #[arg(long, env = "GANTRY_S3_PART_SIZE_MB", default_value_t = 16)]
    pub s3_part_size_mb: u64,
}

impl StorageArgs {
    pub fn open(&self, data_dir: &std::path::Path) -> anyhow::Result<Storage> {
        match self.storage.as_deref() {
            Some(location) if location.starts_with("s3://") => {
                let (bucket, prefix) = Storage::parse_s3_location(location)?;
                let (Some(access_key_id), Some(secret_access_key)) =
                    (&self.s3_access_key_id, &self.s3_secret_access_key)
                else {
                    anyhow::bail!(
                        "S3 storage needs credentials: set --s3-access-key-id/AWS_ACCESS_KEY_ID and --s3-secret-access-key/AWS_SECRET_ACCESS_KEY"
                    );
                };
                Ok(Storage::s3(&S3Settings {
                    bucket,
                    prefix,
                    endpoint: self.s3_endpoint.clone(),
                    region: self.s3_region.clone(),
                    access_key_id: access_key_id.clone(),
                    secret_access_key: secret_access_key.expose().to_string(),
                    path_style: self.s3_path_style,
                    timeout: std::time::Duration::from_secs(self.s3_timeout_seconds.max(1)),
                })
                .with_part_size(self.s3_part_size_mb * 1024 * 1024))
            }
            Some(directory) => Ok(Storage::local(directory)),
            None => Ok(Storage::local(data_dir.join("objects"))),
        }
    }
}

fn walk_local(root: &Path, start: &Path) -> io::Result<Vec<ObjectInfo>> {
    let mut objects = Vec::new();
    let mut folders = vec![start.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = match std::fs::read_dir(&folder) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // What another deletion (a second retention pass) removes under the walk is gone, not an
        // error.
        fn gone<T>(result: io::Result<T>) -> io::Result<Option<T>> {
            match result {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                other => other.map(Some),
            }
        }
        for entry in entries {
            let Some(entry) = gone(entry)? else { continue };
            let Some(file_type) = gone(entry.file_type())? else { continue };
            let path = entry.path();
            if file_type.is_dir() {
                folders.push(path);
            } else if file_type.is_file() && !entry.file_name().to_string_lossy().starts_with(".incoming-") {
                let Some(metadata) = gone(entry.metadata())? else { continue };
                let modified = metadata.modified()?;
                let micros = modified.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or_default();
                let key = path.strip_prefix(root).expect("walked below the root").to_string_lossy().into_owned();
                objects.push(ObjectInfo { key, modified: i64::try_from(micros).unwrap_or(i64::MAX) });
            }
        }
    }
    objects.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(objects)
}

/// Removes `folder` and the folders below it that hold no file; true when `folder` went away.
fn prune_local(folder: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(folder) else { return false };
    let mut empty = true;
    for entry in entries.flatten() {
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        empty &= is_dir && prune_local(&entry.path());
    }
    empty && std::fs::remove_dir(folder).is_ok()
}

fn s3_error(
    operation: &'static str,
    bucket: &str,
    key: &str,
    error: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::S3 { operation, bucket: bucket.into(), key: key.into(), failure: None, source: Box::new(error) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_keys_cannot_escape_the_root() {
        let root = Path::new("/data");
        assert!(Storage::local_path(root, "../etc/passwd").is_err());
        assert!(Storage::local_path(root, "/etc/passwd").is_err());
        assert!(Storage::local_path(root, "a/./b").is_ok());
        assert!(Storage::local_path(root, "a/../b").is_err());
        assert!(Storage::local_path(root, "").is_err());
    }

    /// Two deletions of one tree at once (two retention passes, two replicas) both succeed:
    /// what vanishes under one of them because the other removed it is gone, not an error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_deletions_of_a_local_tree_both_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::Local { root: dir.path().to_path_buf() };
        for round in 0..50 {
            for folder in 0..20 {
                let folder = dir.path().join(format!("jobs/{round}/{folder}"));
                std::fs::create_dir_all(&folder).unwrap();
                for file in 0..10 {
                    std::fs::write(folder.join(format!("{file}.log")), b"x").unwrap();
                }
            }
            let prefix = format!("jobs/{round}/");
            let (first, second) = tokio::join!(
                tokio::spawn({
                    let (storage, prefix) = (storage.clone(), prefix.clone());
                    async move { storage.delete_tree(&prefix).await }
                }),
                tokio::spawn({
                    let (storage, prefix) = (storage.clone(), prefix.clone());
                    async move { storage.delete_tree(&prefix).await }
                })
            );
            let (first, second) = (first.unwrap(), second.unwrap());
            assert!(first.is_ok() && second.is_ok(), "round {round}: {first:?} / {second:?}");
            assert!(!dir.path().join(format!("jobs/{round}")).exists());
        }
    }

    #[test]
    fn s3_locations_split_into_bucket_and_prefix() {
        assert_eq!(Storage::parse_s3_location("s3://b/p/q").unwrap(), ("b".into(), "p/q".into()));
        assert_eq!(Storage::parse_s3_location("s3://b").unwrap(), ("b".into(), "".into()));
        assert!(Storage::parse_s3_location("s3://").is_err());
        assert!(Storage::parse_s3_location("/tmp").is_err());
    }
}
