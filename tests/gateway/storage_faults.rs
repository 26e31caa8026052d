//! Storage failing under a running gateway, one row of the fault table per fault: a data folder
//! that is full or read-only answers 507 naming the folder and what was not stored, an object
//! store that cannot be reached or refuses answers 503 with `Retry-After` naming the store;
//! nothing partial is left or listed, and everything works again once the fault is lifted.
//! And what an artifact may unpack to: bounded at upload and again when a job unpacks it.

use std::path::Path;

use serde_json::{Value, json};

use crate::fault_guards::{Tmpfs, can_inject, root_missing};
use crate::harness::{Backend, Gateway, Reply, tar_of};

const TEXT: &[u8] = b"some text\n";

async fn upload_file(gateway: &Gateway, name: &str, bytes: &[u8]) -> Reply {
    gateway.post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", name, bytes)]).await
}

async fn listed_files(gateway: &Gateway) -> Value {
    let reply = gateway.get("/api/v1/files/?function=fn", "alice").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["results"].clone()
}

async fn upload_function(gateway: &Gateway, title: &str) -> Reply {
    let artifact = tar_of(&[("main.py", b"print('hello')\n")]);
    gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", title), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await
}

fn assert_refused(reply: &Reply, status: u16, message: &str) {
    assert_eq!(reply.status, status, "{}", reply.json);
    assert_eq!(reply.json, json!({"message": message}));
}

/// Mounts a tmpfs over `folder`, or says why the test skips.
fn tmpfs(folder: &Path, size_kib: u64) -> Option<Tmpfs> {
    if !can_inject("storage full", root_missing()) {
        return None;
    }
    match Tmpfs::mount(folder, size_kib) {
        Ok(mount) => Some(mount),
        Err(why) if !can_inject("storage full", Some(why.clone())) => None,
        Err(why) => panic!("{why}"),
    }
}

/// SQLite + local storage, the objects folder full: a file upload, a function upload and a
/// saved result answer 507 naming the folder and what was not stored; nothing of them is kept
/// or listed, reads and readiness go on; freed, the same requests succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_folder_answers_507_and_keeps_nothing() {
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    let objects = gateway.data_dir().join("objects");
    let Some(mount) = tmpfs(&objects, 256) else { return };
    assert_eq!(upload_function(&gateway, "fn").await.status, 200);
    assert_eq!(upload_file(&gateway, "kept.txt", TEXT).await.status, 200);
    let job = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "fn", "arguments": "{}"})).await;
    assert_eq!(job.status, 200, "{}", job.json);
    let job_id = job.json["id"].as_str().unwrap().to_string();
    let before = mount.files();
    mount.fill("filler");

    let folder = objects.display();
    let reply = upload_file(&gateway, "data.txt", TEXT).await;
    assert_refused(
        &reply,
        507,
        &format!("The data folder {folder} is full (no space left on device): the file data.txt was not stored."),
    );
    let reply = upload_function(&gateway, "other").await;
    assert_refused(
        &reply,
        507,
        &format!(
            "The data folder {folder} is full (no space left on device): the artifact artifact.tar was not stored."
        ),
    );
    let reply = gateway.post_json(&format!("/api/v1/jobs/{job_id}/result/"), "alice", json!({"result": "{}"})).await;
    assert_refused(
        &reply,
        507,
        &format!(
            "The data folder {folder} is full (no space left on device): the result of job {job_id} was not stored."
        ),
    );
    let mut after = mount.files();
    after.retain(|file| file != "filler");
    assert_eq!(after, before, "nothing partial is left in the folder");
    assert_eq!(listed_files(&gateway).await, json!(["kept.txt"]));
    assert_eq!(gateway.get("/api/v1/programs/get_by_title/other/", "alice").await.status, 404);
    assert!(gateway.spool_files().is_empty(), "the spooled uploads are gone");
    assert_eq!(gateway.get("/readiness/", "").await.status, 200, "reads go on");

    std::fs::remove_file(objects.join("filler")).unwrap();
    assert_eq!(upload_file(&gateway, "data.txt", TEXT).await.status, 200);
    assert_eq!(upload_function(&gateway, "other").await.status, 200);
    let reply = gateway.post_json(&format!("/api/v1/jobs/{job_id}/result/"), "alice", json!({"result": "{}"})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(listed_files(&gateway).await, json!(["data.txt", "kept.txt"]));
}

/// The same on PostgreSQL + S3, the object store's own disk full: the store answers an error
/// of its own (it does not say it is full), so the answer is 503 naming the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_with_a_full_disk_answers_503_and_keeps_nothing() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    // The store's whole folder (it stages objects beside its buckets), with the bucket made again.
    let root = gateway.data_dir().join("s3");
    let Some(mount) = tmpfs(&root, 256) else { return };
    std::fs::create_dir(root.join("gantry")).unwrap();
    let reply = upload_function(&gateway, "fn").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(upload_file(&gateway, "kept.txt", TEXT).await.status, 200);
    mount.fill("filler");

    let reply = upload_file(&gateway, "data.txt", TEXT).await;
    assert_eq!(reply.status, 503, "{}", reply.json);
    assert_eq!(reply.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
    let message = reply.message();
    assert!(message.starts_with("The object store s3://gantry/test is unavailable (it answered 5"), "{message}");
    assert!(message.ends_with("): the file data.txt was not stored; retry in a few seconds."), "{message}");
    assert_eq!(listed_files(&gateway).await, json!(["kept.txt"]));
    assert!(gateway.spool_files().is_empty(), "the spooled uploads are gone");

    std::fs::remove_file(root.join("filler")).unwrap();
    assert_eq!(upload_file(&gateway, "data.txt", TEXT).await.status, 200);
    assert_eq!(listed_files(&gateway).await, json!(["data.txt", "kept.txt"]));
}

/// The upload spool full (the data folder's disk, which the upload reaches first): 507 naming
/// the upload folder and the file; nothing is kept; once there is room, the upload succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_upload_folder_answers_507_and_keeps_nothing() {
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    assert_eq!(upload_function(&gateway, "fn").await.status, 200);
    let spool = gateway.data_dir().join("spool");
    let Some(mount) = tmpfs(&spool, 64) else { return };
    let big = vec![b'x'; 256 * 1024];

    let reply = upload_file(&gateway, "big.txt", &big).await;
    let folder = spool.display();
    assert_refused(
        &reply,
        507,
        &format!("The upload folder {folder} is full (no space left on device): the file big.txt was not stored."),
    );
    assert_eq!(mount.files(), Vec::<String>::new(), "the partial spool file is gone");
    assert_eq!(listed_files(&gateway).await, json!([]));

    drop(mount);
    assert_eq!(upload_file(&gateway, "big.txt", &big).await.status, 200);
    assert_eq!(listed_files(&gateway).await, json!(["big.txt"]));
}

/// The objects folder read-only: writes answer 507 saying it cannot be written and what did
/// not happen; reads go on; writable again, the writes succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_folder_answers_507_and_reads_go_on() {
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    let objects = gateway.data_dir().join("objects");
    let Some(mount) = tmpfs(&objects, 1024) else { return };
    assert_eq!(upload_function(&gateway, "fn").await.status, 200);
    assert_eq!(upload_file(&gateway, "kept.txt", TEXT).await.status, 200);
    mount.set_read_only(true);

    let folder = objects.display();
    let reply = upload_file(&gateway, "data.txt", TEXT).await;
    assert_refused(
        &reply,
        507,
        &format!(
            "The data folder {folder} cannot be written (read-only file system): the file data.txt was not stored."
        ),
    );
    let reply = gateway.delete("/api/v1/files/delete/?function=fn&file=kept.txt", "alice").await;
    assert_refused(
        &reply,
        507,
        &format!(
            "The data folder {folder} cannot be written (read-only file system): the file kept.txt was not deleted."
        ),
    );
    assert_eq!(listed_files(&gateway).await, json!(["kept.txt"]));
    let download = gateway.get("/api/v1/files/download/?function=fn&file=kept.txt", "alice").await;
    assert_eq!((download.status.as_u16(), download.bytes.as_slice()), (200, TEXT));

    mount.set_read_only(false);
    assert_eq!(upload_file(&gateway, "data.txt", TEXT).await.status, 200);
    assert_eq!(gateway.delete("/api/v1/files/delete/?function=fn&file=kept.txt", "alice").await.status, 200);
    assert_eq!(listed_files(&gateway).await, json!(["data.txt"]));
}

/// An object store that cannot be reached, one that never answers, then one that refuses the
/// server's credentials:
/// 503 with `Retry-After` naming the store and why, readiness not ready while it cannot be
/// reached; the store back, everything answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_refusing_object_store_answers_503_and_recovers() {
    let mut gateway = Gateway::start(Backend::PostgresS3).await;
    assert_eq!(upload_function(&gateway, "fn").await.status, 200);
    let working = gateway.state.storage.clone();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let store = |endpoint: String, secret: &str| {
        gantry::storage::Storage::s3(&gantry::storage::S3Settings {
            bucket: "gantry".into(),
            prefix: "test".into(),
            endpoint: Some(endpoint),
            region: "us-east-1".into(),
            access_key_id: crate::harness::S3_KEY.into(),
            secret_access_key: secret.into(),
            path_style: true,
            timeout: std::time::Duration::from_secs(1),
        })
    };

    gateway.state.storage = store(format!("http://127.0.0.1:{closed}"), crate::harness::S3_SECRET);
    let reply = upload_file(&gateway, "data.txt", TEXT).await;
    assert_eq!(reply.status, 503, "{}", reply.json);
    assert_eq!(reply.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
    let message = reply.message();
    assert!(message.starts_with("The object store s3://gantry/test is unavailable (cannot reach it: "), "{message}");
    assert!(message.ends_with("): the file data.txt was not stored; retry in a few seconds."), "{message}");
    let reply = gateway.get("/api/v1/files/?function=fn", "alice").await;
    assert_eq!(reply.status, 503, "{}", reply.json);
    assert!(reply.message().ends_with("); retry in a few seconds."), "{}", reply.message());
    let ready = gateway.get("/readiness/", "").await;
    assert_eq!((ready.status.as_u16(), ready.json), (503, json!({"status": "storage_unavailable"})));

    // A store that takes the connection and never answers: cut at the S3 timeout, not held.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    gateway.state.storage = store(format!("http://{}", silent.local_addr().unwrap()), crate::harness::S3_SECRET);
    let started = std::time::Instant::now();
    let reply = upload_file(&gateway, "data.txt", TEXT).await;
    assert_eq!(reply.status, 503, "{}", reply.json);
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "held for {:?}", started.elapsed());
    let message = reply.message();
    assert!(message.starts_with("The object store s3://gantry/test is unavailable ("), "{message}");
    assert!(message.ends_with("): the file data.txt was not stored; retry in a few seconds."), "{message}");
    drop(silent);

    gateway.state.storage = store(gateway.s3_endpoint().unwrap(), "not-the-secret");
    let reply = upload_file(&gateway, "data.txt", TEXT).await;
    assert_eq!(reply.status, 503, "{}", reply.json);
    let message = reply.message();
    assert!(message.starts_with("The object store s3://gantry/test is unavailable (it answered 403 "), "{message}");
    assert!(message.ends_with("): the file data.txt was not stored; retry in a few seconds."), "{message}");

    gateway.state.storage = working;
    assert_eq!(gateway.get("/readiness/", "").await.status, 200);
    assert_eq!(upload_file(&gateway, "data.txt", TEXT).await.status, 200);
    assert_eq!(listed_files(&gateway).await, json!(["data.txt"]));
}

/// A tar whose member `holes.bin` is a GNU sparse file of 512 stored bytes declaring
/// `declared` bytes (the rest holes), beside `main.py`.
pub fn sparse_artifact(declared: u64) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut main = tar::Header::new_gnu();
    main.set_size(15);
    main.set_mode(0o644);
    builder.append_data(&mut main, "main.py", &b"print('hello')\n"[..]).unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_path("holes.bin").unwrap();
    header.set_entry_type(tar::EntryType::GNUSparse);
    header.set_mode(0o644);
    header.set_size(512);
    let gnu = header.as_gnu_mut().unwrap();
    gnu.set_real_size(declared);
    gnu.sparse[0].set_offset(declared - 512);
    gnu.sparse[0].set_length(512);
    header.set_cksum();
    builder.append(&header, &[b'x'; 512][..]).unwrap();
    builder.into_inner().unwrap()
}

const GIB: u64 = 1024 * 1024 * 1024;

/// A 2 KiB artifact whose sparse member declares 2 GiB: refused at upload with a 400 naming the
/// limit, nothing stored; under a larger limit it is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_unpacking_past_the_limit_is_refused_at_upload() {
    let artifact = sparse_artifact(2 * GIB);
    assert!(artifact.len() < 4096);
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "sparse"), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_refused(
        &reply,
        400,
        "Invalid artifact: it unpacks to more than the limit of 512 MiB (--max-unpacked-mib): \
         with member 'holes.bin' (2048 MiB) it reaches 2049 MiB.",
    );
    assert_eq!(gateway.get("/api/v1/programs/get_by_title/sparse/", "alice").await.status, 404);
    assert!(!gateway.data_dir().join("objects/artifacts").exists(), "no artifact was stored");

    let generous = Gateway::start_with(Backend::SqliteLocal, |config| config.max_unpacked_mib = 4096).await;
    let reply = generous
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "sparse"), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
}

/// An artifact stored under a larger limit (as one stored before the limit existed): the job
/// fails with a reason naming the limit (that nothing is written past it is the launcher's
/// own test, `launcher::tests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_artifact_past_the_limit_fails_its_job_naming_the_limit() {
    let gateway = Gateway::start_with(Backend::SqliteLocal, |config| config.max_unpacked_mib = 4096)
        .await
        .with_runner(|config| config.max_unpacked_mib = 512)
        .await;
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "sparse"), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &sparse_artifact(2 * GIB))],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let job = gateway.post_json("/api/v1/programs/run/", "alice", json!({"title": "sparse", "arguments": "{}"})).await;
    assert_eq!(job.status, 200, "{}", job.json);
    let job_id = job.json["id"].as_str().unwrap();
    let terminal = |job: &Value| matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"));
    let record = gateway.wait_for_job("alice", job_id, 60, terminal).await;
    assert_eq!(record["status"], "FAILED", "{record}");
    let logs = gateway.get(&format!("/api/v1/jobs/{job_id}/logs/"), "alice").await.json;
    let events = gateway.get(&format!("/api/v1/jobs/{job_id}/events/"), "alice").await.json;
    let said = format!("{logs} {events}");
    assert!(said.contains("more than the limit of 512 MiB (--max-unpacked-mib)"), "{said}");
}
