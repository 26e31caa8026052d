//! Abusive clients cannot hold the server: slow headers, a stalled body and idle keep-alive
//! connections are closed while others are answered; connections over the cap are refused at
//! once (`503`) when all are answering, else the one waiting longest makes room; accepting goes on;
//! a shutdown ends within its grace whatever clients do; and a real `gantry serve` under a 1,024
//! open-files limit answers real requests while 1,200 idle connections are held.

use std::net::SocketAddr;
use std::time::Duration;

use gantry::ops::ConnectionLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::eventually::until;
use crate::harness::{Backend, Gateway};

/// Longest any test waits for something the server must do (a bound against hanging, not a
/// measure of speed).
const PATIENCE: Duration = Duration::from_secs(20);

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_timeout: Duration::from_secs(30),
        body_timeout: Duration::from_secs(30),
        body_min_rate: 1024,
        idle_timeout: Duration::from_secs(30),
        max_connections: 100,
        shutdown_grace: Duration::from_secs(30),
    }
}

struct Served {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    gateway: Gateway,
}

async fn serve(limits: ConnectionLimits) -> Served {
    let gateway = Gateway::start(Backend::SqliteLocal).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(gantry::ops::serve_http(listener, gateway.state.clone(), None, limits, async {
        let _ = stopped.await;
    }));
    Served { address, stop: Some(stop), task, gateway }
}

/// A whole `GET /version/` on a fresh connection answers 200.
async fn answers(address: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(address).await.ok()?;
        stream.write_all(b"GET /version/ HTTP/1.1\r\nhost: gantry\r\nconnection: close\r\n\r\n").await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(answer.starts_with(b"HTTP/1.1 200"))
    };
    tokio::time::timeout(Duration::from_secs(5), attempt).await.ok().flatten().unwrap_or(false)
}

/// Reads until the server closes the connection; what it sent before.
async fn closed_by_server(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let reading = async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, reading).await.expect("the server closes the connection");
    received
}

#[tokio::test]
async fn slow_headers_are_cut_while_others_are_answered() {
    let served = serve(ConnectionLimits { header_timeout: Duration::from_secs(1), ..limits() }).await;
    let mut slow = TcpStream::connect(served.address).await.unwrap();
    let (mut reader, mut writer) = slow.split();
    let dripping = async {
        for byte in b"GET /version/ HTTP/1.1\r\nhost: gantry\r\nx-slow: ".iter().cycle() {
            if writer.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let watching = async {
        assert!(answers(served.address).await, "another client is answered meanwhile");
        let mut buffer = [0u8; 64];
        let read = tokio::time::timeout(PATIENCE, reader.read(&mut buffer)).await.expect("the slow client is cut");
        assert!(matches!(read, Ok(0) | Err(_)), "nothing answered to a request never finished: {read:?}");
    };
    tokio::select! {
        () = dripping => panic!("the server kept reading a request whose headers never end"),
        () = watching => {}
    }
    assert!(answers(served.address).await, "the server answers after cutting the slow client");
}

#[tokio::test]
async fn a_stalled_body_gets_408_and_its_connection_closed() {
    let served = serve(ConnectionLimits { body_timeout: Duration::from_secs(1), ..limits() }).await;
    let mut stalled = TcpStream::connect(served.address).await.unwrap();
    stalled
        .write_all(
            b"POST /api/v1/programs/run/ HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer alice\r\n\
content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"title\": ",
        )
        .await
        .unwrap();
    assert!(answers(served.address).await, "another client is answered while the body is stalled");
    let answer = closed_by_server(&mut stalled).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("without a byte of the request body"), "{text}");
    assert!(answers(served.address).await);
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let served = serve(ConnectionLimits {
        idle_timeout: Duration::from_secs(1),
        header_timeout: Duration::from_secs(1),
        ..limits()
    })
    .await;
    // One that answered a request and keeps the connection open for more.
    let mut kept = TcpStream::connect(served.address).await.unwrap();
    kept.write_all(b"GET /version/ HTTP/1.1\r\nhost: gantry\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.ends_with(b"}") {
        let n = tokio::time::timeout(PATIENCE, kept.read(&mut buffer)).await.unwrap().unwrap();
        assert!(n > 0, "the connection is kept alive after its answer");
        answer.extend_from_slice(&buffer[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    // One that never sends anything.
    let mut silent = TcpStream::connect(served.address).await.unwrap();
    assert!(closed_by_server(&mut kept).await.is_empty());
    assert!(closed_by_server(&mut silent).await.is_empty());
    assert!(answers(served.address).await);
}

/// A request whose body is stalled (below the body timeout): its connection is answering.
async fn busy_connection(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            b"POST /api/v1/programs/run/ HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer alice\r\n\
content-type: application/json\r\ncontent-length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
    stream
}

#[tokio::test]
async fn connections_over_the_cap_are_refused_at_once_when_all_are_answering() {
    let served = serve(ConnectionLimits { max_connections: 3, ..limits() }).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(busy_connection(served.address).await);
    }
    // Let the server take the three requests before the next client arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut excess = TcpStream::connect(served.address).await.unwrap();
    let answer = closed_by_server(&mut excess).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("retry-after: 1"), "{text}");
    // A closed connection frees its place: a new client is answered.
    open.pop();
    until("a freed place is taken by a new client", PATIENCE, || answers(served.address)).await;
}

/// Issue 49: sockets held without a request filled the cap and kept every user out (503) until
/// they timed out. At the cap, the one waiting longest makes room; one answering never does.
#[tokio::test]
async fn at_the_cap_the_connection_waiting_longest_makes_room() {
    let served = serve(ConnectionLimits { max_connections: 3, ..limits() }).await;
    let mut oldest = TcpStream::connect(served.address).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut busy = busy_connection(served.address).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut younger = TcpStream::connect(served.address).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(answers(served.address).await, "a real request at the cap is answered");
    assert!(closed_by_server(&mut oldest).await.is_empty(), "the connection silent longest was closed");
    // The cap reached again by a newer silent one: the younger of the two makes room next.
    let _newest = TcpStream::connect(served.address).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(answers(served.address).await, "a real request at the cap is answered again");
    assert!(closed_by_server(&mut younger).await.is_empty(), "then the one silent longest of those left");
    // The one answering a request was never chosen: its request still ends with its own answer.
    let answer = tokio::time::timeout(Duration::from_millis(300), busy.read(&mut [0u8; 16])).await;
    assert!(answer.is_err(), "the connection with a request in progress is left alone: {answer:?}");
}

/// Issue 49: 2,000 connections that never sent a byte were all still open 35 s later with a 30 s
/// header timeout: the deadline ran from a first byte that never came.
#[tokio::test]
async fn a_connection_that_never_speaks_is_closed_at_the_header_deadline() {
    let served = serve(ConnectionLimits {
        header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(60),
        ..limits()
    })
    .await;
    let started = tokio::time::Instant::now();
    let mut silent = TcpStream::connect(served.address).await.unwrap();
    assert!(closed_by_server(&mut silent).await.is_empty());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "closed at the header deadline, not the idle one: {took:?}");
}

/// Issue 49: an upload trickled at a byte at a time never stalled long enough for the body
/// timeout (it restarts with every byte) and held its connection for good. Now the body must
/// keep the minimum rate once the body timeout has passed: 408 within it plus a second, and
/// the cut upload's spool file is gone.
#[tokio::test]
async fn a_trickled_body_gets_408_within_its_deadline_and_leaves_no_spool_file() {
    let served = serve(ConnectionLimits { body_timeout: Duration::from_secs(2), ..limits() }).await;
    let mut trickled = TcpStream::connect(served.address).await.unwrap();
    let head = "--b\r\ncontent-disposition: form-data; name=\"file\"; filename=\"slow.bin\"\r\n\r\n";
    trickled
        .write_all(
            format!(
                "POST /api/v1/files/upload/?function=f HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer alice\r\n\
content-type: multipart/form-data; boundary=b\r\ncontent-length: 100000\r\n\r\n{head}"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let (mut reader, mut writer) = trickled.split();
    let dripping = async {
        loop {
            if writer.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::future::pending::<()>().await;
    };
    let mut answer = Vec::new();
    let reading = async {
        let mut buffer = [0u8; 4096];
        while let Ok(Ok(n)) = tokio::time::timeout(PATIENCE, reader.read(&mut buffer)).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buffer[..n]);
        }
    };
    tokio::select! {
        () = dripping => {}
        () = reading => {}
    }
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("the request body arrived too slowly"), "{text}");
    assert!(took < Duration::from_secs(4), "408 within the body timeout plus a second or so: {took:?}");
    until("the cut upload's spool file is removed", PATIENCE, || async { served.gateway.spool_files().is_empty() })
        .await;
    assert!(answers(served.address).await);
}

#[test]
fn a_bodys_deadline_grows_with_what_it_received() {
    use gantry::ops::body_deadline;
    let start = tokio::time::Instant::now();
    let grace = Duration::from_secs(60);
    assert_eq!(body_deadline(start, 0, grace, 1024), start + grace);
    assert_eq!(body_deadline(start, 10 * 1024, grace, 1024), start + Duration::from_secs(70));
    assert_eq!(body_deadline(start, 60, grace, 1024) - start, grace + Duration::from_secs_f64(60.0 / 1024.0));
    assert!(body_deadline(start, u64::MAX, grace, 1) > start + grace, "no overflow");
}

#[tokio::test]
async fn shutdown_ends_within_the_grace_whatever_clients_do() {
    let mut served = serve(ConnectionLimits { shutdown_grace: Duration::from_secs(1), ..limits() }).await;
    // A request in flight that never completes (its body stalls, below the body timeout), and an
    // idle keep-alive connection.
    let mut stalled = busy_connection(served.address).await;
    let mut idle = TcpStream::connect(served.address).await.unwrap();
    assert!(answers(served.address).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    served.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(PATIENCE, &mut served.task)
        .await
        .expect("the server ends after its grace")
        .unwrap()
        .expect("it ends without error");
    assert!(closed_by_server(&mut idle).await.is_empty());
    closed_by_server(&mut stalled).await;
    assert!(TcpStream::connect(served.address).await.is_err(), "the listener is closed");
}

#[tokio::test]
async fn a_live_stream_is_never_idle_and_shutdown_cuts_it() {
    let mut served = serve(ConnectionLimits {
        idle_timeout: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(1),
        ..limits()
    })
    .await;
    let gateway = &served.gateway;
    let job_id = queued_job(gateway).await;
    // The job stays queued (no runner): its event stream stays open with nothing to send.
    let request = format!(
        "GET /api/v1/jobs/{job_id}/events/stream/ HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer alice\r\n\r\n"
    );
    let mut stream = open_stream(served.address, &request).await;
    let mut buffer = [0u8; 4096];
    // Twice the idle timeout without a byte either way: still open.
    let quiet = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buffer)).await;
    assert!(quiet.is_err() || quiet.as_ref().is_ok_and(|read| read.as_ref().is_ok_and(|n| *n > 0)), "{quiet:?}");
    served.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(PATIENCE, &mut served.task).await.expect("shutdown ends the stream").unwrap().unwrap();
    closed_by_server(&mut stream).await;
}

/// A job of Alice's that stays queued (the gateway has no runner), so its streams stay open.
async fn queued_job(gateway: &Gateway) -> String {
    let artifact = crate::harness::tar_of(&[("main.py", b"print('hi')\n".as_slice())]);
    let reply = gateway
        .post_multipart(
            "/api/v1/programs/upload/",
            "alice",
            &[("title", "quiet"), ("entrypoint", "main.py")],
            &[("artifact", "artifact.tar", &artifact)],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let reply = gateway
        .post_json("/api/v1/programs/run/", "alice", serde_json::json!({"title": "quiet", "arguments": "{}"}))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["id"].as_str().unwrap().to_string()
}

/// Sends `request` and reads the answer's head (the stream stays open after it).
async fn open_stream(address: SocketAddr, request: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await.unwrap().unwrap();
        assert!(n > 0, "the stream is answered");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    stream
}

#[tokio::test]
async fn shutdown_ends_live_streams_at_once_with_a_restarting_event() {
    // A grace far longer than the test's patience: the streams must end because the server
    // says it is restarting, not because the grace ran out.
    let mut served = serve(ConnectionLimits { shutdown_grace: Duration::from_secs(120), ..limits() }).await;
    let gateway = &served.gateway;
    let job_id = queued_job(gateway).await;
    // The job stays queued (no runner): its streams stay open with nothing to send.
    let get = |path: &str, accept: &str| {
        format!(
            "GET /api/v1/jobs/{job_id}/{path} HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer alice\r\naccept: {accept}\r\n\r\n"
        )
    };
    let mut events = open_stream(served.address, &get("events/stream/", "text/event-stream")).await;
    let mut sse_log = open_stream(served.address, &get("logs/stream/", "text/event-stream")).await;
    let mut text_log = open_stream(served.address, &get("logs/stream/", "text/plain")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    served.stop.take().unwrap().send(()).unwrap();
    let events = String::from_utf8_lossy(&closed_by_server(&mut events).await).into_owned();
    assert!(events.contains("event: restarting") && events.contains("reconnect"), "{events}");
    let sse_log = String::from_utf8_lossy(&closed_by_server(&mut sse_log).await).into_owned();
    assert!(sse_log.contains("event: restarting"), "{sse_log}");
    assert!(!sse_log.contains("event: end"), "the log did not end, the server did: {sse_log}");
    // The plain-text stream (resumed with `offset`) simply ends, whole: its last chunk is sent.
    let text_log = String::from_utf8_lossy(&closed_by_server(&mut text_log).await).into_owned();
    assert!(text_log.ends_with("0\r\n\r\n"), "a chunked answer that ended: {text_log:?}");
    // With nothing left in flight, the server is done long before its grace.
    tokio::time::timeout(PATIENCE, &mut served.task).await.expect("the server ends").unwrap().unwrap();
}

/// Raises this process's soft open-files limit to its hard limit (the test opens 1,200 sockets).
fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    limit.rlim_cur
}

#[tokio::test]
async fn serve_under_1024_open_files_answers_after_1200_idle_connections() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    if raise_open_files_limit() < 1400 {
        eprintln!("skipped: this process may not open 1,400 files");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--runner", "none", "--data-dir"])
        .arg(dir.path())
        // Timeouts far beyond the test's patience: what admits a client at the cap is eviction.
        .args(["--idle-timeout-seconds", "120", "--header-timeout-seconds", "120"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 1024, rlim_max: 1024 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("gantry serve starts");
    let stdout = child.stdout.take().unwrap();
    let (found, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("gantry listening on http://") {
                let _ = found.send(rest.split_whitespace().next().unwrap_or_default().to_string());
            }
        }
    });
    let address: SocketAddr = address.recv_timeout(PATIENCE).expect("gantry serve listens").parse().unwrap();

    let mut idle = Vec::new();
    for _ in 0..1200 {
        match TcpStream::connect(address).await {
            Ok(stream) => idle.push(stream),
            Err(error) => panic!("connecting failed after {} connections: {error}", idle.len()),
        }
    }
    // While they are all open, the cap (768 under 1,024 files) reached by connections that never
    // speak, real requests are answered at once: each evicts the one silent longest.
    for _ in 0..20 {
        assert!(answers(address).await, "gantry serve answers a real request at the cap");
    }
    let mut first = idle.swap_remove(0);
    assert!(closed_by_server(&mut first).await.is_empty(), "the oldest idle connection was closed to make room");
    drop(idle);
    let _ = child.kill();
    let _ = child.wait();
}
