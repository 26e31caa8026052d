//! Moving file contents in and out of storage at the disk's speed (docs/benchmarks.md, "Files at
//! the disk's speed"): local objects are read in large chunks, the next one read while the
//! previous is sent; S3 objects pass on the chunks the connection delivers; a finished upload is
//! moved into a local directory rather than copied, or sent to S3 in parts when it is large.
//! Each way holds a few chunks in memory, whatever the object's size.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};

use super::refusal::s3_sdk_error;
use super::{Error, ObjectStream};

/// Chunk size of local downloads: large enough that a transfer costs few thread hand-overs
/// and socket writes, small enough that a download holds little memory (two chunks).
pub const READ_CHUNK_BYTES: usize = 1024 * 1024;

/// Default part size of S3 multipart uploads; an object larger than one part goes up in parts.
pub const DEFAULT_PART_BYTES: u64 = 16 * 1024 * 1024;

/// The smallest part S3 accepts (all but the last part of an upload).
pub const MIN_PART_BYTES: u64 = 5 * 1024 * 1024;

/// The most parts one S3 upload may have.
const MAX_PARTS: u64 = 10_000;

/// Parts sent at once.
const PARTS_IN_FLIGHT: usize = 4;

/// Streams the first `size` bytes of a local file in `READ_CHUNK_BYTES` chunks, the next chunk
/// read (on the blocking pool) while the current one is sent.
pub fn local_file_stream(file: std::fs::File, size: u64) -> ObjectStream {
    let file = Arc::new(file);
    let first = (size > 0).then(|| read_chunk(Arc::clone(&file), 0, chunk_len(0, size)));
    futures::stream::unfold((file, 0u64, first), move |(file, offset, next)| async move {
        let chunk = match next?.await {
            Ok(chunk) => chunk,
            Err(joined) => Err(io::Error::other(joined)),
        };
        match chunk {
            // The file ended early: the answer's declared length tells the client.
            Ok(chunk) if chunk.is_empty() => None,
            Ok(chunk) => {
                let offset = offset + chunk.len() as u64;
                let next = (offset < size).then(|| read_chunk(Arc::clone(&file), offset, chunk_len(offset, size)));
                Some((Ok(chunk), (file, offset, next)))
            }
            Err(error) => Some((Err(error), (file, offset, None))),
        }
    })
    .boxed()
}

fn chunk_len(offset: u64, size: u64) -> usize {
    usize::try_from(size - offset).unwrap_or(usize::MAX).min(READ_CHUNK_BYTES)
}

/// Reads up to `len` bytes at `offset` (fewer only at the end of the file).
fn read_chunk(file: Arc<std::fs::File>, offset: u64, len: usize) -> tokio::task::JoinHandle<io::Result<Bytes>> {
    tokio::task::spawn_blocking(move || {
        let mut buffer = BytesMut::with_capacity(len);
        while buffer.len() < len {
            let filled = buffer.len();
            let at = i64::try_from(offset + filled as u64).map_err(io::Error::other)?;
            let spare = &mut buffer.spare_capacity_mut()[..len - filled];
            // SAFETY: pread(2) writes at most `spare.len()` bytes into `spare`, memory the buffer
            // owns; `set_len` below covers only the bytes it reports written.
            let read = unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), at) };
            match read {
                0 => break,
                n if n > 0 => {
                    // SAFETY: the `n` bytes after the current length were just written by pread.
                    unsafe { buffer.set_len(filled + n as usize) };
                }
                _ => {
                    let error = io::Error::last_os_error();
                    if error.kind() != io::ErrorKind::Interrupted {
                        return Err(error);
                    }
                }
            }
        }
        Ok(buffer.freeze())
    })
}

/// Passes on the chunks of an S3 object's body as the connection delivers them.
pub fn s3_body_stream(body: ByteStream) -> ObjectStream {
    futures::stream::try_unfold(body, |mut body| async move {
        Ok(body.try_next().await.map_err(io::Error::other)?.map(|chunk| (chunk, body)))
    })
    .boxed()
}

/// How `move_local` put a finished file in place.
#[derive(Debug, PartialEq, Eq)]
pub enum Moved {
    /// Renamed to a name that held nothing: nothing is left at the file's old name.
    Renamed,
    /// Exchanged with the file `destination` held, which is now at the file's old name, for the
    /// caller to remove when it likes.
    Exchanged,
    /// On another file system: nothing moved, the caller copies.
    OtherFileSystem,
}

/// Moves a finished local file into `destination`, replacing what it held, when both are on one
/// file system. The object appears whole or not at all: readers see the old file or the new.
///
/// A file already at `destination` is exchanged with it (`renameat2(RENAME_EXCHANGE)`) rather
/// than renamed over: a rename over an existing file makes ext4 start writing the new file's
/// data out inside the rename (`auto_da_alloc`), and frees the replaced file's pages there, which
/// on this project's machine held a 10 MiB upload's answer for up to 10 ms (docs/benchmarks.md,
/// "Files at the disk's speed"). The replaced file is left at the file's old name for the caller
/// to remove off the request's path. Where the file system cannot exchange, a plain rename.
pub async fn move_local(file: &Path, destination: &Path) -> io::Result<Moved> {
    let (file, destination) = (file.to_path_buf(), destination.to_path_buf());
    tokio::task::spawn_blocking(move || move_local_now(&file, &destination)).await.map_err(io::Error::other)?
}

fn move_local_now(file: &Path, destination: &Path) -> io::Result<Moved> {
    let other_file_system = |error: &io::Error| error.raw_os_error() == Some(libc::EXDEV);
    // Only a regular file is exchanged: a folder of that name must refuse the upload (as a
    // rename does), not end up at the spool's name.
    let replaces_a_file = std::fs::symlink_metadata(destination).is_ok_and(|m| m.file_type().is_file());
    if replaces_a_file {
        match exchange(file, destination) {
            Ok(()) if std::fs::symlink_metadata(file).is_ok_and(|m| m.file_type().is_file()) => {
                return Ok(Moved::Exchanged);
            }
            Ok(()) => {
                // Something other than a file took the name meanwhile: put it back.
                exchange(file, destination)?;
                return Err(io::Error::new(io::ErrorKind::IsADirectory, "the destination is not a file"));
            }
            Err(error) if other_file_system(&error) => return Ok(Moved::OtherFileSystem),
            // Gone meanwhile (ENOENT), or a file system that cannot exchange: rename.
            Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::EINVAL | libc::ENOSYS)) => {}
            Err(error) => return Err(error),
        }
    }
    match std::fs::rename(file, destination) {
        Ok(()) => Ok(Moved::Renamed),
        Err(error) if other_file_system(&error) => Ok(Moved::OtherFileSystem),
        Err(error) => Err(error),
    }
}

/// Exchanges the files at two paths of one file system, atomically.
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = |path: &Path| std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other);
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let done =
        unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if done == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The part size for an object of `size` bytes: `part_bytes`, or larger when the object would
/// need more than S3's 10,000 parts.
pub fn part_size(size: u64, part_bytes: u64) -> u64 {
    part_bytes.max(MIN_PART_BYTES).max(size.div_ceil(MAX_PARTS))
}

/// A multipart upload of one local file: the file `path` (`size` bytes) to `bucket`/`full_key`
/// (`key` without the storage's prefix, for messages).
pub struct MultipartUpload {
    pub client: aws_sdk_s3::Client,
    pub bucket: String,
    pub full_key: String,
    pub key: String,
    pub path: std::path::PathBuf,
    pub size: u64,
    pub part_bytes: u64,
}

impl MultipartUpload {
    /// Sends the file in parts of `part_size(size, part_bytes)`, a few at once, each streamed
    /// from the file. On any failure the upload is aborted, so the store keeps neither the object
    /// nor its parts. The work runs as a task of its own, from the upload's creation to its
    /// completion or abort: a caller that goes away (a client that disconnects) does not leave
    /// an upload half done.
    pub async fn send(self) -> Result<(), Error> {
        let (bucket, key) = (self.bucket.clone(), self.key.clone());
        let task = tokio::spawn(async move {
            let created = self
                .client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.full_key)
                .send()
                .await
                .map_err(|e| s3_sdk_error("start upload of", &self.bucket, &self.key, e))?;
            let upload_id = created.upload_id().unwrap_or_default();
            let sent = self.send_parts(upload_id).await;
            if sent.is_err() {
                let abort = self.client.abort_multipart_upload().bucket(&self.bucket).key(&self.full_key);
                if let Err(error) = abort.upload_id(upload_id).send().await {
                    let error = s3_sdk_error("abort upload of", &self.bucket, &self.key, error);
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        upload_id,
                        "a failed upload's parts stay in the store"
                    );
                }
            }
            sent
        });
        task.await.map_err(|e| super::s3_error("write", &bucket, &key, e))?
    }

    async fn send_parts(&self, upload_id: &str) -> Result<(), Error> {
        let Self { client, bucket, full_key, key, path, size, part_bytes } = self;
        let (size, part) = (*size, part_size(*size, *part_bytes));
        let parts: Vec<CompletedPart> = futures::stream::iter(1..=size.div_ceil(part).max(1))
            .map(|number| async move {
                let offset = (number - 1) * part;
                let length = part.min(size - offset);
                let body = ByteStream::read_from()
                    .path(path)
                    .buffer_size(READ_CHUNK_BYTES)
                    .offset(offset)
                    .length(Length::Exact(length))
                    .build()
                    .await
                    .map_err(|e| super::s3_error("read upload for", bucket, key, e))?;
                let number = i32::try_from(number).expect("at most 10,000 parts");
                let sent = client
                    .upload_part()
                    .bucket(bucket)
                    .key(full_key)
                    .upload_id(upload_id)
                    .part_number(number)
                    .content_length(i64::try_from(length).unwrap_or(i64::MAX))
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| s3_sdk_error("write", bucket, key, e))?;
                let e_tag = sent.e_tag().map(str::to_string);
                Ok::<_, Error>(CompletedPart::builder().part_number(number).set_e_tag(e_tag).build())
            })
            .buffered(PARTS_IN_FLIGHT)
            .try_collect()
            .await?;
        client
            .complete_multipart_upload()
            .bucket(bucket)
            .key(full_key)
            .upload_id(upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .send()
            .await
            .map(|_| ())
            .map_err(|e| s3_sdk_error("write", bucket, key, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_stay_within_the_limits_of_s3() {
        assert_eq!(part_size(1, DEFAULT_PART_BYTES), DEFAULT_PART_BYTES);
        assert_eq!(part_size(1, 1), MIN_PART_BYTES);
        let huge: u64 = 5 * 1024 * 1024 * 1024 * 1024; // 5 TiB, S3's largest object
        assert!(huge.div_ceil(part_size(huge, DEFAULT_PART_BYTES)) <= MAX_PARTS);
    }

    #[tokio::test]
    async fn a_finished_file_takes_the_place_of_a_file_and_never_of_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, object) = (dir.path().join("spool"), dir.path().join("object"));
        std::fs::write(&spool, b"first").unwrap();
        assert_eq!(move_local(&spool, &object).await.unwrap(), Moved::Renamed);
        assert!(!spool.exists());
        std::fs::write(&spool, b"second").unwrap();
        assert_eq!(move_local(&spool, &object).await.unwrap(), Moved::Exchanged);
        assert_eq!(std::fs::read(&object).unwrap(), b"second");
        assert_eq!(std::fs::read(&spool).unwrap(), b"first", "the replaced file, for the caller to remove");
        // A folder of the object's name: refused, both left as they were.
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("inside"), b"kept").unwrap();
        assert!(move_local(&spool, &folder).await.is_err());
        assert_eq!(std::fs::read(folder.join("inside")).unwrap(), b"kept");
        assert_eq!(std::fs::read(&spool).unwrap(), b"first");
        // A missing source is an error, whatever the destination.
        assert!(move_local(&dir.path().join("missing"), &object).await.is_err());
        assert_eq!(std::fs::read(&object).unwrap(), b"second");
    }

    #[tokio::test]
    async fn a_local_file_streams_whole_in_bounded_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let contents: Vec<u8> = (0..(2 * READ_CHUNK_BYTES + 12_345)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &contents).unwrap();
        let chunks: Vec<Bytes> =
            local_file_stream(std::fs::File::open(&path).unwrap(), contents.len() as u64).try_collect().await.unwrap();
        assert!(chunks.iter().all(|c| c.len() <= READ_CHUNK_BYTES), "chunks bound a download's memory");
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks.concat(), contents);
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let none: Vec<Bytes> = local_file_stream(std::fs::File::open(&empty).unwrap(), 0).try_collect().await.unwrap();
        assert!(none.is_empty());
    }

    /// Serves the S3 protocol (s3s-fs) from `root` on a loopback port; while `refusing` is set,
    /// the upload of any part 2 is answered 403. Returns the endpoint.
    async fn s3_server(root: &Path, refusing: Arc<std::sync::atomic::AtomicBool>) -> String {
        std::fs::create_dir_all(root.join("gantry")).unwrap();
        let mut builder = s3s::service::S3ServiceBuilder::new(s3s_fs::FileSystem::new(root).unwrap());
        builder.set_auth(s3s::auth::SimpleAuth::from_single("key", "secret"));
        let s3 = builder.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (s3, refusing) = (s3.clone(), Arc::clone(&refusing));
                let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (s3, refusing) = (s3.clone(), Arc::clone(&refusing));
                    async move {
                        let part_two = request.uri().query().is_some_and(|q| q.contains("partNumber=2"));
                        if part_two && refusing.load(std::sync::atomic::Ordering::Relaxed) {
                            let refused = hyper::Response::builder().status(403).body(s3s::Body::from(String::new()));
                            return Ok(refused.unwrap());
                        }
                        hyper::service::Service::call(&s3, request).await
                    }
                });
                tokio::spawn(
                    hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service)
                        .into_owned(),
                );
            }
        });
        format!("http://{address}")
    }

    /// What an upload may leave in s3s-fs's folder: its id, its parts, its metadata, staging files.
    fn upload_leftovers(root: &Path) -> Vec<String> {
        let names = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
        names.filter(|n| n.starts_with(".upload") || n.contains(".upload-") || n.starts_with(".tmp")).collect()
    }

    /// A file larger than a part goes up in parts and comes back whole; an upload the store
    /// refuses halfway is aborted: no object, no part, no upload left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_files_go_up_in_parts_and_a_failed_upload_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("s3");
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let endpoint = s3_server(&root, Arc::clone(&refusing)).await;
        let storage = super::super::Storage::s3(&super::super::S3Settings {
            bucket: "gantry".into(),
            prefix: "test".into(),
            endpoint: Some(endpoint),
            region: "us-east-1".into(),
            access_key_id: "key".into(),
            secret_access_key: "secret".into(),
            path_style: true,
            timeout: std::time::Duration::from_secs(60),
        })
        .with_part_size(1);
        let contents: Vec<u8> =
            (0..2 * MIN_PART_BYTES + 4321).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        let file = dir.path().join("upload");
        std::fs::write(&file, &contents).unwrap();

        storage.put_file("big.bin", &file).await.unwrap();
        assert!(storage.read_to_bytes("big.bin").await.unwrap().unwrap() == contents, "the object differs");
        let super::super::Storage::S3 { client, .. } = &storage else { unreachable!() };
        let head = client.head_object().bucket("gantry").key("test/big.bin").send().await.unwrap();
        assert!(head.e_tag().unwrap().trim_matches('"').ends_with("-3"), "three parts: {:?}", head.e_tag());
        assert_eq!(upload_leftovers(&root), Vec::<String>::new());

        refusing.store(true, std::sync::atomic::Ordering::Relaxed);
        let refused = storage.put_file("refused.bin", &file).await.unwrap_err();
        assert!(matches!(refused, Error::S3 { operation: "write", .. }), "{refused:?}");
        assert!(storage.get("refused.bin").await.unwrap().is_none(), "no object");
        assert_eq!(upload_leftovers(&root), Vec::<String>::new(), "no upload nor part");
        assert_eq!(storage.list("").await.unwrap(), ["big.bin"]);
        assert_eq!(storage.read_to_bytes("big.bin").await.unwrap().map(|b| b.len()), Some(contents.len()));
    }
}
