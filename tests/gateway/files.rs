//! User and provider files: round trips, streaming, MIME allow-list, traversal.

use axum::body::Body;
use serde_json::json;

use crate::both_backends;
use crate::eventually::{eventually, until, until_blocking};
use crate::harness::{Backend, Gateway, multipart};

both_backends!(
    user_files_round_trip,
    large_files_stream_both_ways,
    an_upload_replaces_the_file_of_its_name,
    uploads_outside_the_allow_list_are_refused,
    names_cannot_escape_their_folder,
    provider_files_round_trip,
    custom_functions_of_a_user_share_one_area,
    provider_function_areas_are_per_function_and_per_user,
    files_of_the_per_function_layout_move_into_the_users_area,
);

async fn custom_functions_of_a_user_share_one_area(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    for title in ["producer", "consumer"] {
        gateway.upload_function("alice", &[("title", title), ("entrypoint", "main.py")]).await;
    }
    gateway.upload_function("bob", &[("title", "consumer"), ("entrypoint", "main.py")]).await;
    let upload = gateway
        .post_multipart("/api/v1/files/upload/?function=producer", "alice", &[], &[("file", "out.txt", b"42\n")])
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    // Listed, downloaded and deleted through the user's other custom function.
    for path in ["/api/v1/files/?function=consumer", "/api/v1/files/?function=producer"] {
        assert_eq!(gateway.get(path, "alice").await.json, json!({"results": ["out.txt"]}), "{path}");
    }
    assert_eq!(gateway.get("/api/v1/files/list/?function=consumer", "alice").await.json, json!({"files": ["out.txt"]}));
    let download = gateway.get("/api/v1/files/download/?function=consumer&file=out.txt", "alice").await;
    assert_eq!((download.status.as_u16(), download.bytes.as_slice()), (200, b"42\n".as_slice()));
    assert_eq!(gateway.get("/api/v1/files/?function=consumer", "bob").await.json, json!({"results": []}));
    // A function the caller does not have still answers 404.
    let unknown = gateway.get("/api/v1/files/?function=nope", "alice").await;
    assert_eq!((unknown.status.as_u16(), unknown.message()), (404, "Qiskit Function nope doesn't exist.".into()));
    let deleted = gateway.delete("/api/v1/files/delete/?function=consumer&file=out.txt", "alice").await;
    assert_eq!(deleted.status, 200);
    assert_eq!(gateway.get("/api/v1/files/?function=producer", "alice").await.json, json!({"results": []}));
}

async fn provider_function_areas_are_per_function_and_per_user(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "erin").await;
    for title in ["acme/one", "acme/two"] {
        gateway.upload_function("erin", &[("title", title), ("entrypoint", "main.py")]).await;
    }
    for user in ["alice", "bob"] {
        gateway.admin(gantry::admin::AdminCommand::AddMember { group: "users".into(), user: user.into() }).await;
    }
    for function in ["one", "two"] {
        gateway.grant_run("acme", function, "users").await;
    }
    gateway.upload_function("alice", &[("title", "own"), ("entrypoint", "main.py")]).await;
    let upload = gateway
        .post_multipart("/api/v1/files/upload/?function=one&provider=acme", "alice", &[], &[("file", "a.txt", b"a")])
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    assert_eq!(upload.message(), "users/alice/providers/acme/one/data/a.txt");
    let list = |function: &'static str, provider: Option<&'static str>, user: &'static str| {
        let path = match provider {
            Some(provider) => format!("/api/v1/files/?function={function}&provider={provider}"),
            None => format!("/api/v1/files/?function={function}"),
        };
        let gateway = &gateway;
        async move { gateway.get(&path, user).await.json }
    };
    assert_eq!(list("one", Some("acme"), "alice").await, json!({"results": ["a.txt"]}));
    assert_eq!(list("two", Some("acme"), "alice").await, json!({"results": []}), "another provider function");
    assert_eq!(list("one", Some("acme"), "bob").await, json!({"results": []}), "another user");
    assert_eq!(list("own", None, "alice").await, json!({"results": []}), "the user's custom area");
}

async fn files_of_the_per_function_layout_move_into_the_users_area(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    for title in ["a", "b"] {
        gateway.upload_function("alice", &[("title", title), ("entrypoint", "main.py")]).await;
    }
    let storage = &gateway.state.storage;
    let put = |key: &'static str, text: &'static str| async move {
        storage.put_bytes(key, bytes::Bytes::from(text)).await.unwrap();
    };
    put("users/alice/functions/b/data/clash.txt", "older").await;
    put("users/alice/functions/a/data/only-a.txt", "a").await;
    put("users/alice/functions/b/data/results/job.json", "{}").await;
    put("users/bob/functions/a/data/bob.txt", "bob").await;
    // Object times may have one-second resolution: make the second copy clearly newer.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    put("users/alice/functions/a/data/clash.txt", "newer").await;

    gantry::serve::migrate_storage(&gateway.state.db, storage).await.unwrap();
    assert_eq!(
        gateway.get("/api/v1/files/?function=b", "alice").await.json,
        json!({"results": ["clash.txt", "only-a.txt"]})
    );
    let clash = gateway.get("/api/v1/files/download/?function=b&file=clash.txt", "alice").await;
    assert_eq!(clash.bytes, b"newer", "the newest of two files of the same name is kept");
    assert_eq!(storage.read_to_bytes("users/alice/data/results/job.json").await.unwrap().unwrap().as_ref(), b"{}");
    assert_eq!(storage.read_to_bytes("users/bob/data/bob.txt").await.unwrap().unwrap().as_ref(), b"bob");
    let left: Vec<String> = storage.list_tree("users/").await.unwrap().into_iter().map(|o| o.key).collect();
    assert!(left.iter().all(|key| !key.contains("/functions/")), "{left:?}");

    // Recorded as done: files placed in the old layout later are not moved by another start.
    put("users/alice/functions/a/data/late.txt", "late").await;
    gantry::serve::migrate_storage(&gateway.state.db, storage).await.unwrap();
    assert_eq!(
        gateway.get("/api/v1/files/?function=b", "alice").await.json,
        json!({"results": ["clash.txt", "only-a.txt"]})
    );
}

async fn user_files_round_trip(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let upload = gateway
        .post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", "data.csv", b"a,b\n1,2\n")])
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    assert!(upload.message().ends_with("data.csv"));
    gateway
        .post_multipart("/api/v1/files/upload?function=fn", "alice", &[], &[("file", "notes.txt", b"hello\n")])
        .await;

    assert_eq!(
        gateway.get("/api/v1/files?function=fn", "alice").await.json,
        json!({"results": ["data.csv", "notes.txt"]})
    );
    assert_eq!(
        gateway.get("/api/v1/files/list/?function=fn", "alice").await.json,
        json!({"files": ["data.csv", "notes.txt"]})
    );

    let download = gateway.get("/api/v1/files/download?function=fn&file=data.csv", "alice").await;
    assert_eq!(download.status, 200);
    assert_eq!(download.bytes, b"a,b\n1,2\n");
    assert_eq!(download.headers["content-type"], "text/csv");
    assert_eq!(download.headers["content-disposition"], "attachment; filename=data.csv");
    assert_eq!(download.headers["content-length"], "8");

    // Files are per user: another user's function of the same title has its own area.
    gateway.upload_function("bob", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    assert_eq!(gateway.get("/api/v1/files?function=fn", "bob").await.json, json!({"results": []}));

    let deleted = gateway.delete("/api/v1/files/delete?function=fn&file=data.csv", "alice").await;
    assert_eq!(deleted.json, json!({"message": "Requested file was deleted."}));
    let again = gateway.delete("/api/v1/files/delete/?function=fn&file=data.csv", "alice").await;
    assert_eq!((again.status.as_u16(), again.message()), (404, "Requested file was not found.".into()));
    let missing = gateway.get("/api/v1/files/download?function=fn&file=data.csv", "alice").await;
    assert_eq!(missing.status, 404);
    assert_eq!(gateway.get("/api/v1/files?function=fn", "alice").await.json, json!({"results": ["notes.txt"]}));

    // Missing parameters and parts.
    assert_eq!(gateway.get("/api/v1/files", "alice").await.status, 400);
    assert_eq!(gateway.get("/api/v1/files/download?function=fn", "alice").await.status, 400);
    let no_file = gateway.post_multipart("/api/v1/files/upload/?function=fn", "alice", &[("x", "y")], &[]).await;
    assert_eq!((no_file.status.as_u16(), no_file.message()), (400, "A file should be uploaded.".into()));
    let unknown = gateway.get("/api/v1/files?function=nope", "alice").await;
    assert_eq!((unknown.status.as_u16(), unknown.message()), (404, "Qiskit Function nope doesn't exist.".into()));
}

async fn large_files_stream_both_ways(backend: Backend) {
    let mut gateway = Gateway::start(backend).await;
    // Parts of S3's smallest size, so that this file goes up in three of them.
    gateway.state.storage = gateway.state.storage.clone().with_part_size(5 * 1024 * 1024);
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    // 12 MiB of non-text bytes: many chunks each way, three S3 parts.
    let content: Vec<u8> = (0..12 * 1024 * 1024).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let upload = gateway
        .post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", "blob.bin", &content)])
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    let download = gateway.get("/api/v1/files/download/?function=fn&file=blob.bin", "alice").await;
    assert_eq!(download.status, 200);
    assert_eq!(download.headers["content-length"], content.len().to_string());
    assert!(download.bytes == content, "downloaded bytes differ");
    // The spooled upload was moved into storage (local) or removed once sent (S3).
    let spool = gateway.spool_files();
    assert!(spool.is_empty(), "{spool:?}");
}

/// A file uploaded again under its name replaces it whole (on local storage the spool file takes
/// its place by an exchange, and the replaced file is removed after the answer), and a folder of
/// that name refuses the upload without losing anything.
async fn an_upload_replaces_the_file_of_its_name(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    for content in [b"first\n".as_slice(), b"second, longer\n", b"3\n"] {
        let upload = gateway
            .post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", "a.txt", content)])
            .await;
        assert_eq!(upload.status, 200, "{}", upload.json);
        let download = gateway.get("/api/v1/files/download/?function=fn&file=a.txt", "alice").await;
        assert_eq!(download.bytes, content);
    }
    assert_eq!(gateway.get("/api/v1/files/?function=fn", "alice").await.json, json!({"results": ["a.txt"]}));
    // The replaced files leave the spool (removed off the request's path: wait for it).
    eventually("the replaced files are removed", std::time::Duration::from_secs(2), || async {
        let left = gateway.spool_files();
        if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) }
    })
    .await;

    // On local storage, a folder where the file would go: refused, the folder kept whole.
    let Some(root) = gateway.local_objects_dir() else { return };
    let folder = root.join("users/alice/data/b.txt");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("inside"), b"kept").unwrap();
    let refused =
        gateway.post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", "b.txt", b"x\n")]).await;
    // Issue 49: this was a 500 "internal error"; a job can make such a folder in its user's area.
    assert_eq!(refused.status, 409, "{}", refused.json);
    assert!(refused.message().contains("b.txt") && refused.message().contains("folder"), "{}", refused.message());
    assert_eq!(std::fs::read(folder.join("inside")).unwrap(), b"kept");
    assert_eq!(gateway.spool_files(), Vec::<String>::new(), "the refused upload's spool file is removed");
}

async fn uploads_outside_the_allow_list_are_refused(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01";
    for (name, bytes) in [("image.png", png.as_slice()), ("page.txt", b"<html><body>hi</body></html>".as_slice())] {
        let reply =
            gateway.post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", name, bytes)]).await;
        assert_eq!(reply.status, 400, "{name}");
        assert!(reply.message().starts_with("Uploaded file is not a valid type"), "{}", reply.message());
    }
    assert_eq!(gateway.get("/api/v1/files?function=fn", "alice").await.json, json!({"results": []}));
    // Allowed kinds: JSON, gzip, tar.
    for (name, bytes) in
        [("a.json", b"{\"a\": 1}".as_slice()), ("a.gz", [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3].as_slice())]
    {
        let reply =
            gateway.post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", name, bytes)]).await;
        assert_eq!(reply.status, 200, "{name}: {}", reply.json);
    }
}

async fn names_cannot_escape_their_folder(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("bob", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway
        .post_multipart("/api/v1/files/upload/?function=fn", "bob", &[], &[("file", "secret.txt", b"bob's secret")])
        .await;

    // An uploaded name with a path keeps only its basename, inside the caller's folder.
    let reply = gateway
        .post_multipart("/api/v1/files/upload/?function=fn", "alice", &[], &[("file", "../../bob/data/evil.txt", b"x")])
        .await;
    assert_eq!(reply.status, 200);
    assert!(reply.message().starts_with("users/alice/data/"), "{}", reply.message());
    assert_eq!(gateway.get("/api/v1/files?function=fn", "bob").await.json, json!({"results": ["secret.txt"]}));
    assert_eq!(gateway.get("/api/v1/files?function=fn", "alice").await.json, json!({"results": ["evil.txt"]}));

    for file in
        ["../../bob/data/secret.txt", "..%2F..%2Fbob%2Fdata%2Fsecret.txt", "%2Fetc%2Fpasswd", "..", "secret.txt%00"]
    {
        let download = gateway.get(&format!("/api/v1/files/download?function=fn&file={file}"), "alice").await;
        assert_eq!(download.status, 404, "{file}");
        assert_ne!(download.bytes, b"bob's secret");
        let delete = gateway.delete(&format!("/api/v1/files/delete?function=fn&file={file}"), "alice").await;
        assert_eq!(delete.status, 404, "{file}");
    }
    assert_eq!(gateway.get("/api/v1/files?function=fn", "bob").await.json, json!({"results": ["secret.txt"]}));
    // Titles with traversal are sanitized into names that do not exist.
    for function in ["..%2F..%2Fbob", "%2Fetc%2Fpasswd", "%00nope%2F.."] {
        let reply = gateway.get(&format!("/api/v1/files?function={function}"), "alice").await;
        assert_eq!(reply.status, 404, "{function}");
    }
    // A multipart part name with NUL or absolute path is reduced too.
    let (content_type, body) = multipart(&[], &[("file", "/etc/passwd", b"root")]);
    let reply = gateway
        .call("POST", "/api/v1/files/upload/?function=fn", Some("alice"), Some(&content_type), Body::from(body))
        .await;
    assert!(reply.message().starts_with("users/alice/data/passwd"), "{}", reply.message());
}

async fn provider_files_round_trip(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.provider("acme", None, "erin").await;
    gateway.upload_function("erin", &[("title", "acme/tool"), ("entrypoint", "main.py")]).await;
    let upload = gateway
        .post_multipart(
            "/api/v1/files/provider/upload/?function=tool&provider=acme",
            "erin",
            &[],
            &[("file", "model.json", b"{}")],
        )
        .await;
    assert_eq!(upload.status, 200, "{}", upload.json);
    assert_eq!(upload.message(), "providers/acme/tool/data/model.json");
    assert_eq!(
        gateway.get("/api/v1/files/provider?function=tool&provider=acme", "erin").await.json,
        json!({"results": ["model.json"]})
    );
    let download =
        gateway.get("/api/v1/files/provider/download?function=tool&provider=acme&file=model.json", "erin").await;
    assert_eq!(download.bytes, b"{}");
    // Not visible in the user area of the same function.
    assert_eq!(gateway.get("/api/v1/files?function=tool&provider=acme", "erin").await.json, json!({"results": []}));
    let missing_provider = gateway.get("/api/v1/files/provider?function=tool", "erin").await;
    assert_eq!(
        (missing_provider.status.as_u16(), missing_provider.message()),
        (400, "'provider' not provided or is not valid".into())
    );
    let unknown = gateway.get("/api/v1/files/provider?function=tool&provider=nope", "erin").await;
    assert_eq!((unknown.status.as_u16(), unknown.message()), (404, "Provider nope doesn't exist.".into()));
    let stranger = gateway
        .post_multipart(
            "/api/v1/files/provider/upload/?function=tool&provider=acme",
            "bob",
            &[],
            &[("file", "x.txt", b"x")],
        )
        .await;
    assert_eq!(stranger.status, 404);
    let deleted =
        gateway.delete("/api/v1/files/provider/delete?function=tool&provider=acme&file=model.json", "erin").await;
    assert_eq!(deleted.status, 200);
    assert_eq!(
        gateway.get("/api/v1/files/provider?function=tool&provider=acme", "erin").await.json,
        json!({"results": []})
    );
}

/// Issue 49: SIGTERM then SIGKILL during a large upload left its partial spool file, still there
/// 10 s after the next start (a start removed only files ten minutes old). A start now removes
/// every spool file no upload holds, and a running server sweeps them every period.
#[tokio::test]
async fn a_killed_uploads_spool_file_is_gone_after_the_next_start_and_swept_while_running() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let start = || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["serve", "--listen", "127.0.0.1:0", "--runner", "none", "--data-dir"])
            .arg(dir.path())
            .env_remove("DATABASE_URL")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("gantry serve starts");
        // Read to its end on a thread of its own: the server must never write into a closed pipe.
        let stdout = child.stdout.take().unwrap();
        let (lines, said_lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut said = Vec::new();
        while let Ok(line) = said_lines.recv_timeout(std::time::Duration::from_secs(30)) {
            said.push(line.clone());
            if let Some(rest) = line.strip_prefix("gantry listening on http://") {
                let address: std::net::SocketAddr = rest.split_whitespace().next().unwrap().parse().unwrap();
                return (child, address, said);
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("gantry serve did not listen: {said:?}");
    };
    let spool = dir.path().join("spool");
    let spool_files = || std::fs::read_dir(&spool).map(|entries| entries.count()).unwrap_or(0);

    let (mut first, address, _) = start();
    let mut upload = std::net::TcpStream::connect(address).unwrap();
    let head = "--b\r\ncontent-disposition: form-data; name=\"file\"; filename=\"big.csv\"\r\n\r\n";
    write!(
        upload,
        "POST /api/v1/files/upload/?function=f HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer alice\r\n\
         content-type: multipart/form-data; boundary=b\r\ncontent-length: 40000000\r\n\r\n{head}"
    )
    .unwrap();
    upload.write_all(&vec![b'a'; 4 << 20]).unwrap();
    until_blocking("the upload's spool file appears", std::time::Duration::from_secs(20), || spool_files() > 0);
    first.kill().unwrap();
    first.wait().unwrap();
    drop(upload);
    assert_eq!(spool_files(), 1, "precondition: the killed upload's partial file is left");
    // The moment between a spool file's creation and its lock is spared: past it, the next start
    // removes the file.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let (mut second, _, said) = start();
    assert_eq!(spool_files(), 0, "the next start removed it: {said:?}");
    assert!(said.iter().any(|line| line.starts_with("removed 1 file(s) left in")), "{said:?}");
    second.kill().unwrap();
    second.wait().unwrap();

    // While running: a sweep removes what no upload holds (one a failed upload left after the
    // start), period after period.
    let sweeping = gantry::ops::keep_spool_clean(&spool, std::time::Duration::from_millis(200));
    std::fs::write(spool.join(".tmpCUT"), b"left by a failed upload").unwrap();
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(10);
    std::fs::File::options().write(true).open(spool.join(".tmpCUT")).unwrap().set_modified(then).unwrap();
    until("a sweep period removes it", std::time::Duration::from_secs(20), || async { spool_files() == 0 }).await;
    sweeping.abort();
}
