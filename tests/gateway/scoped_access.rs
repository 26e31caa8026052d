//! A job pod's view of storage: no credentials, only presigned URLs for its own objects. The
//! real `gantry launch` runs a job with nothing but `GANTRY_JOB_ACCESS` against the in-process
//! S3 server and ships its result, logs and exit record; other objects stay out of reach.

use std::time::Duration;

use gantry::storage::access::JobAccess;
use gantry::storage::keys;

use crate::harness::{Backend, Gateway, tar_of};

const JOB_ID: &str = "0f2c0000-0000-4000-8000-00000000abcd";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launcher_with_scoped_access_ships_its_job_without_credentials() {
    let gateway = Gateway::start(Backend::PostgresS3).await;
    let storage = &gateway.state.storage;
    let artifact_key = "artifacts/f/1.tar";
    let main = "import json, os\nwith open(os.environ['ARGUMENTS_PATH']) as f:\n    n = json.load(f)['n']\nprint('[PUBLIC] twice', 2 * n)\nwith open(os.environ['RESULTS_PATH'], 'w') as f:\n    json.dump({'twice': 2 * n}, f)\n";
    storage.put_bytes(artifact_key, tar_of(&[("main.py", main.as_bytes())]).into()).await.unwrap();
    storage.put_bytes(&keys::job_arguments(JOB_ID), r#"{"n": 21}"#.into()).await.unwrap();
    storage.put_bytes("users/bob/data/secret.txt", "bob's".into()).await.unwrap();
    let access = JobAccess::presign(storage, JOB_ID, Some(artifact_key), Duration::from_secs(600)).await.unwrap();
    assert!(!format!("{access:?}").contains("http"), "URLs are not Debug-printed");

    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .arg("launch")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GANTRY_JOB_ID", JOB_ID)
        .env("GANTRY_WORK_DIR", work.path().join("work"))
        .env("GANTRY_ARTIFACT_KEY", artifact_key)
        .env("GANTRY_ENTRYPOINT", "main.py")
        .env("GANTRY_PYTHON", "python3")
        .env("GANTRY_JOB_ACCESS", serde_json::to_string(&access).unwrap())
        .env("DATA_PATH", &data)
        .env("ARGUMENTS_PATH", data.join(format!("arguments/{JOB_ID}.json")))
        .env("RESULTS_PATH", data.join(format!("results/{JOB_ID}.json")))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "launcher failed: {stderr}");
    let read = |key: String| async move {
        storage.read_to_bytes(&key).await.unwrap().map(|b| String::from_utf8(b.to_vec()).unwrap())
    };
    assert_eq!(read(keys::job_result(JOB_ID)).await.as_deref(), Some(r#"{"twice": 42}"#));
    assert_eq!(read(keys::job_user_log(JOB_ID)).await.as_deref(), Some("twice 42\n"));
    let exit: serde_json::Value = serde_json::from_str(&read(keys::job_exit(JOB_ID)).await.unwrap()).unwrap();
    assert_eq!(exit["exit_code"], 0, "{exit}");

    // The access names this job's objects only. (That a URL edited to another key is refused
    // is the S3 server's signature check; the in-process test server does not check query
    // signatures, so it is not asserted here.)
    let elsewhere = access.download("users/bob/data/secret.txt", &work.path().join("stolen")).await;
    assert!(elsewhere.is_err(), "{elsewhere:?}");
}
