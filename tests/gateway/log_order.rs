//! Logs in the order the process wrote them: the existing gateway's `test_simple_function` logic
//! (lines of the client's logger, on stderr, and of `print`, on stdout, one after the other; the
//! log's tail compared exactly), 20 times on the local runner (what `gantry serve` runs) and 20
//! times through pods. The launcher gives the function one pipe for both streams, so nothing
//! can reorder them.

use std::time::Duration;

use serde_json::{Value, json};

use crate::controller::Cluster;
use crate::harness::{Backend, Gateway, tar_of};

const LINES: usize = 15;

/// Logger and print lines interleaved, then the delay lines of `test_simple_function`.
fn function() -> String {
    format!(
        "import time\nfrom qiskit_serverless import get_logger\nlogger = get_logger()\n\
         for i in range({LINES}):\n    logger.info(f'logger line {{i}}')\n    print(f'print line {{i}}')\n\
         logger.info('DELAY STARTS')\nprint('DELAY STARTS')\ntime.sleep(0.1)\nprint('DELAY ENDS')\nlogger.info('DELAY ENDS')\n"
    )
}

/// The lines of a log that come from the function, in order, and what they must be.
fn check(log: &str, job: &str) {
    let ours: Vec<String> = log
        .lines()
        .filter(|line| line.contains(" line ") || line.contains("DELAY"))
        .map(|line| {
            // The logger's lines carry its level ("INFO: ..."); print's do not.
            let logger = line.contains("INFO");
            let text = line.rsplit(": ").next().unwrap_or(line);
            format!("{}{text}", if logger { "L " } else { "P " })
        })
        .collect();
    let mut expected: Vec<String> =
        (0..LINES).flat_map(|i| [format!("L logger line {i}"), format!("P print line {i}")]).collect();
    expected.extend(["L DELAY STARTS", "P DELAY STARTS", "P DELAY ENDS", "L DELAY ENDS"].map(str::to_string));
    assert_eq!(ours, expected, "job {job}: the log out of order:\n{log}");
}

async fn logs_of(gateway: &Gateway, user: &str, id: &str) -> String {
    let job = gateway
        .wait_for_job(user, id, 120, |job: &Value| {
            matches!(job["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
        })
        .await;
    let logs = gateway.get(&format!("/api/v1/jobs/{id}/logs/"), user).await.json;
    assert_eq!(job["status"], "SUCCEEDED", "{job}\n{logs}");
    logs["logs"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logger_and_print_lines_keep_their_order_on_the_local_runner() {
    let gateway = Gateway::start(Backend::SqliteLocal).await.with_runner(|_| {}).await;
    let artifact = tar_of(&[("main.py", function().as_bytes())]);
    let users = ["ann", "ben", "cid", "dee"];
    for user in users {
        let upload = gateway
            .post_multipart(
                "/api/v1/programs/upload/",
                user,
                &[("title", "simple"), ("entrypoint", "main.py")],
                &[("artifact", "a.tar", &artifact)],
            )
            .await;
        assert_eq!(upload.status, 200, "{}", upload.json);
    }
    let mut runs = Vec::new();
    for n in 0..20 {
        let user = users[n % users.len()];
        let run = gateway.post_json("/api/v1/programs/run/", user, json!({"title": "simple", "arguments": "{}"})).await;
        assert_eq!(run.status, 200, "{}", run.json);
        runs.push((user, run.json["id"].as_str().unwrap().to_string()));
    }
    for (user, id) in &runs {
        check(&logs_of(&gateway, user, id).await, id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logger_and_print_lines_keep_their_order_through_a_pod() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let cluster = Cluster::start_tuned(gateway, Duration::from_secs(600), Duration::from_secs(3600), |settings| {
        settings.limits.jobs_per_user = 6;
    })
    .await;
    cluster.upload("simple", &function()).await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(cluster.run("simple", "{}").await);
    }
    for id in &ids {
        check(&logs_of(&cluster.gateway, "alice", id).await, id);
    }
}
