//! Test harness: a gateway on a fresh database and fresh storage, driven through the real router
//! with `tower::ServiceExt::oneshot`. Two backends: SQLite + local directory, and a real
//! PostgreSQL (a database per test, dropped afterwards) + a real S3 protocol server (s3s-fs on
//! loopback, started in-process).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use gantry::admin::AdminCommand;
use gantry::api::DEFAULT_UPLOAD_MIME_TYPES;
use gantry::api::{AppState, GatewayConfig};
use gantry::db::Db;
use gantry::storage::{S3Settings, Storage};
use serde_json::Value;
use tower::ServiceExt;

use crate::eventually::eventually;

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    SqliteLocal,
    PostgresS3,
}

/// Default PostgreSQL of the project's machines; CI exports its own `DATABASE_URL`.
const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const S3_KEY: &str = "gantry-test-key";
pub const S3_SECRET: &str = "gantry-test-secret";

pub struct Gateway {
    pub state: AppState,
    s3_endpoint: Option<String>,
    runner_task: Option<tokio::task::JoinHandle<()>>,
    /// The API served on loopback for the jobs' launchers (files API).
    server_task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The runner's job limits: the folders of its job cgroups go with the gateway.
    job_limits: Option<gantry::compute::local::limits::JobLimits>,
    dir: tempfile::TempDir,
    postgres: Option<(String, String)>,
}

/// A response: status, headers and body (JSON when it parses, else a string).
pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub bytes: Vec<u8>,
    pub json: Value,
}

impl Reply {
    pub fn message(&self) -> String {
        self.json["message"].as_str().unwrap_or_default().to_string()
    }
}

impl Gateway {
    pub async fn start(backend: Backend) -> Gateway {
        Self::start_with(backend, |_| {}).await
    }

    pub async fn start_with(backend: Backend, configure: impl FnOnce(&mut GatewayConfig)) -> Gateway {
        let admin_url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.into());
        Self::start_at(backend, &admin_url, configure).await
    }

    /// `start_with`, on PostgreSQL a fresh database of the server at `admin_url` (a superuser's
    /// URL) rather than of `DATABASE_URL`'s.
    pub async fn start_at(backend: Backend, admin_url: &str, configure: impl FnOnce(&mut GatewayConfig)) -> Gateway {
        let admin_url = admin_url.to_string();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = GatewayConfig {
            max_body_bytes: 50 * 1024 * 1024,
            max_arguments_bytes: 32 * 1024 * 1024,
            spool_dir: dir.path().join("spool"),
            version: "9.9.9".into(),
            allowed_mime_types: DEFAULT_UPLOAD_MIME_TYPES.split(',').map(str::to_string).collect(),
            active_jobs_per_user: 50,
            admission: None,
            max_unpacked_mib: gantry::artifact::DEFAULT_MAX_UNPACKED_MIB,
            trace_link: None,
        };
        configure(&mut config);
        let mut s3_endpoint = None;
        let (db, storage, postgres) = match backend {
            Backend::SqliteLocal => {
                let url = format!("sqlite://{}", dir.path().join("gantry.db").display());
                let db = Db::connect(&url).await.expect("sqlite");
                (db, Storage::local(dir.path().join("objects")), None)
            }
            Backend::PostgresS3 => {
                let name = format!("gantry_test_{}", uuid::Uuid::new_v4().simple());
                let admin = Db::connect(&admin_url)
                    .await
                    .unwrap_or_else(|e| panic!("PostgreSQL tests need a server at DATABASE_URL ({admin_url}): {e:?}"));
                let Db::Postgres(pool) = &admin else { panic!("DATABASE_URL must be a postgres:// URL") };
                sqlx::query(&format!("CREATE DATABASE {name}")).execute(pool).await.expect("create test database");
                pool.close().await;
                let base = admin_url.rsplit_once('/').expect("database url has a path").0;
                let db = Db::connect(&format!("{base}/{name}")).await.expect("connect to test database");
                let endpoint = start_s3(dir.path().join("s3")).await;
                s3_endpoint = Some(endpoint.clone());
                let storage = Storage::s3(&S3Settings {
                    bucket: "gantry".into(),
                    prefix: "test".into(),
                    endpoint: Some(endpoint),
                    region: "us-east-1".into(),
                    access_key_id: S3_KEY.into(),
                    secret_access_key: S3_SECRET.into(),
                    path_style: true,
                    timeout: std::time::Duration::from_secs(60),
                });
                (db, storage, Some((admin_url, name)))
            }
        };
        db.migrate().await.expect("migrations");
        storage.check().await.expect("storage reachable");
        let publisher: Arc<dyn gantry::events::Publisher> = Arc::new(gantry::events::LogPublisher);
        Gateway {
            state: AppState {
                compute: Arc::new(gantry::compute::Queue { db: db.clone(), publisher: publisher.clone() }),
                db,
                storage,
                config: Arc::new(config),
                publisher,
                tokens: gantry::secrets::TokenCipher::generate().0,
                auth: Arc::new(gantry::auth::Authenticator::mock()),
                runtime: Arc::new(
                    gantry::auth::runtime_service::RuntimeService::new(
                        None,
                        None,
                        "us-east".into(),
                        std::time::Duration::from_secs(5),
                    )
                    .expect("runtime service client"),
                ),
                follows: Arc::new(gantry::follow::Follows::new(std::time::Duration::from_millis(100))),
                functions: Arc::default(),
                budgets: Arc::default(),
            },
            s3_endpoint,
            runner_task: None,
            server_task: None,
            job_limits: None,
            dir,
            postgres,
        }
    }

    /// The same gateway publishing job status moves to outbound sinks (`configure` edits the
    /// command line's defaults); call it before `with_runner`, which takes the publisher.
    pub async fn with_events(mut self, configure: impl FnOnce(&mut gantry::events::EventArgs)) -> Gateway {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            events: gantry::events::EventArgs,
        }
        let mut args = <Flags as clap::Parser>::parse_from(["gantry"]).events;
        args.events_poll_ms = 50;
        // The job events' tests count job events; the usage events' tests turn them on.
        args.events_usage = false;
        configure(&mut args);
        let publisher = args.start(&self.state.db).await.expect("event sinks start");
        self.state.compute =
            Arc::new(gantry::compute::Queue { db: self.state.db.clone(), publisher: publisher.clone() });
        self.state.publisher = publisher;
        self
    }

    /// Sends a request and returns the response with its body unread (for streamed answers).
    pub async fn open(&self, uri: &str, token: &str, headers: &[(&str, &str)]) -> axum::response::Response {
        let mut request =
            Request::builder().method("GET").uri(uri).header(header::AUTHORIZATION, format!("Bearer {token}"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        gantry::api::app(self.state.clone()).oneshot(request.body(Body::empty()).unwrap()).await.expect("infallible")
    }

    /// The same gateway with a local runner that starts jobs with the real `gantry launch`.
    pub async fn with_runner(mut self, configure: impl FnOnce(&mut gantry::compute::local::RunnerConfig)) -> Gateway {
        let containers = gantry::compute::local::container::ContainerArgs::default().engine().await;
        // Launchers reach S3 through presigned URLs and this gateway's files API, as pods do.
        let storage_args = match &self.state.storage {
            Storage::Local { root } => vec!["--storage".to_string(), root.display().to_string()],
            Storage::S3 { .. } => Vec::new(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the gateway");
        let url = format!("http://{}", listener.local_addr().expect("gateway address"));
        let mut config = gantry::compute::local::RunnerConfig {
            launcher: env!("CARGO_BIN_EXE_gantry").into(),
            python: std::env::var("GANTRY_TEST_PYTHON").unwrap_or_else(|_| "python3".into()),
            work_root: self.dir.path().join("jobs"),
            gateway_host: url,
            limits: gantry::domain::admission::Limits { jobs_per_user: 2, cpu_slots: 6, gpu_slots: 1 },
            fair_share: Default::default(),
            timeout: std::time::Duration::from_secs(3600),
            logs_size_limit: 1024 * 1024,
            max_unpacked_mib: gantry::artifact::DEFAULT_MAX_UNPACKED_MIB,
            tick: std::time::Duration::from_millis(50),
            qiskit_ibm_url: "https://cloud.ibm.com".into(),
            storage_args,
            storage_env: Vec::new(),
            tokens: self.state.tokens.clone(),
            isolation: Some(self.job_isolation()),
            containers,
            // As `gantry serve` bounds them: cgroups where this machine lets the tests make them.
            job_limits: gantry::compute::local::limits::JobLimits::detect(&self.dir.path().join("jobs"), 4096, 1 << 30),
            gpus: std::sync::Arc::new(gantry::compute::local::gpus::GpuPool::empty()),
        };
        configure(&mut config);
        self.job_limits = Some(config.job_limits.clone());
        let runner = gantry::compute::local::LocalRunner::new(
            self.state.db.clone(),
            self.state.storage.clone(),
            config,
            self.state.publisher.clone(),
        );
        self.state.compute = runner.clone();
        let handle = tokio::spawn(runner.run());
        self.runner_task = Some(handle);
        self.server_task = Some(tokio::spawn(gantry::ops::serve_http(
            listener,
            self.state.clone(),
            None,
            gantry::ops::ConnectionArgs::default().limits(),
            std::future::pending(),
        )));
        self
    }

    /// Jobs confined as `gantry serve` confines them: Landlock, and when the tests run as root,
    /// the `nobody` user with the data dir closed to it; this process non-dumpable.
    fn job_isolation(&self) -> gantry::launcher::isolation::JobIsolation {
        use gantry::launcher::isolation;
        isolation::forbid_dumping().expect("non-dumpable");
        let user = isolation::job_user(isolation::running_as_root(), None, None).expect("job user");
        if user.is_some() {
            isolation::restrict_data_dir(self.dir.path(), &self.dir.path().join("jobs")).expect("data dir");
        }
        isolation::JobIsolation { user, readable: Vec::new(), devices: Vec::new() }
    }

    /// The folder holding the database, the objects and the work folders.
    pub fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The names in the upload spool folder (none when it does not exist).
    pub fn spool_files(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.path().join("spool"))
            .map(|entries| entries.map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }

    /// The objects' folder on local storage; `None` on S3.
    pub fn local_objects_dir(&self) -> Option<std::path::PathBuf> {
        match &self.state.storage {
            Storage::Local { root } => Some(root.clone()),
            _ => None,
        }
    }

    /// Polls a job until `done` holds for its record, or panics after `seconds`.
    pub async fn wait_for_job(&self, token: &str, job_id: &str, seconds: u64, done: impl Fn(&Value) -> bool) -> Value {
        eventually(&format!("job {job_id} got there"), std::time::Duration::from_secs(seconds), || async {
            let job = self.get(&format!("/api/v1/jobs/{job_id}/?with_result=false"), token).await.json;
            if done(&job) { Ok(job) } else { Err(job) }
        })
        .await
    }

    pub async fn send(&self, request: Request<Body>) -> Reply {
        let response = gantry::api::app(self.state.clone()).oneshot(request).await.expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body").to_vec();
        let json = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply { status, headers, bytes, json }
    }

    pub async fn call(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        content_type: Option<&str>,
        body: Body,
    ) -> Reply {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        self.send(request.body(body).expect("request")).await
    }

    pub async fn get(&self, uri: &str, token: &str) -> Reply {
        self.call("GET", uri, Some(token), None, Body::empty()).await
    }

    pub async fn delete(&self, uri: &str, token: &str) -> Reply {
        self.call("DELETE", uri, Some(token), None, Body::empty()).await
    }

    pub async fn post_json(&self, uri: &str, token: &str, body: Value) -> Reply {
        self.call("POST", uri, Some(token), Some("application/json"), Body::from(body.to_string())).await
    }

    pub async fn post_form(&self, uri: &str, token: &str, fields: &[(&str, &str)]) -> Reply {
        let body = serde_urlencoded::to_string(fields).expect("form");
        self.call("POST", uri, Some(token), Some("application/x-www-form-urlencoded"), Body::from(body)).await
    }

    pub async fn post_multipart(
        &self,
        uri: &str,
        token: &str,
        fields: &[(&str, &str)],
        files: &[(&str, &str, &[u8])],
    ) -> Reply {
        let (content_type, body) = multipart(fields, files);
        self.call("POST", uri, Some(token), Some(&content_type), Body::from(body)).await
    }

    /// Uploads a user function `title` whose artifact holds `main.py`.
    pub async fn upload_function(&self, token: &str, fields: &[(&str, &str)]) -> Reply {
        let artifact = tar_of(&[("main.py", b"print('hello')\n")]);
        self.post_multipart("/api/v1/programs/upload/", token, fields, &[("artifact", "artifact.tar", &artifact)]).await
    }

    pub async fn admin(&self, command: AdminCommand) -> String {
        gantry::admin::admin(&self.state.db, command).await.expect("admin command")
    }

    /// Grants `group` view and run on the provider function `provider/function`.
    pub async fn grant_run(&self, provider: &str, function: &str, group: &str) {
        self.admin(AdminCommand::Grant {
            provider: provider.into(),
            function: function.into(),
            group: group.into(),
            view: true,
            run: true,
        })
        .await;
    }

    /// A provider `name` with `admin` in its admin group.
    pub async fn provider(&self, name: &str, registry: Option<&str>, admin: &str) {
        self.admin(AdminCommand::CreateProvider { name: name.into(), registry: registry.map(str::to_string) }).await;
        self.admin(AdminCommand::AddAdmin { provider: name.into(), user: admin.into() }).await;
    }
}

impl Gateway {
    /// The URL of this gateway's own PostgreSQL database (PostgreSQL backend only).
    pub fn database_url(&self) -> Option<String> {
        let (admin_url, name) = self.postgres.as_ref()?;
        Some(format!("{}/{name}", admin_url.rsplit_once('/')?.0))
    }

    /// The S3 server's endpoint (PostgreSQL + S3 backend only); bucket `gantry`, prefix `test`.
    pub fn s3_endpoint(&self) -> Option<String> {
        self.s3_endpoint.clone()
    }

    /// Whether `needle` is kept anywhere: every row of every PostgreSQL table, or any file of
    /// this gateway's folder (the SQLite database with its journal, local and S3 objects).
    pub async fn keeps_anywhere(&self, needle: &str) -> bool {
        if let Db::Postgres(pool) = &self.state.db {
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            for table in tables {
                let rows: Vec<String> = sqlx::query_scalar(&format!("SELECT row_to_json(t)::text FROM \"{table}\" t"))
                    .fetch_all(pool)
                    .await
                    .unwrap();
                if rows.iter().any(|row| row.contains(needle)) {
                    return true;
                }
            }
        }
        let mut folders = vec![self.dir.path().to_path_buf()];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else if std::fs::read(&path)
                    .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
                {
                    return true;
                }
            }
        }
        false
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(task) = self.runner_task.take() {
            task.abort();
        }
        if let Some(task) = self.server_task.take() {
            task.abort();
        }
        if let Some(limits) = self.job_limits.take() {
            // Jobs still running when a test ends go with it, their cgroups too.
            limits.remove_stale(&std::collections::HashSet::new());
            limits.remove_folders();
        }
        if let Some((admin_url, name)) = self.postgres.take() {
            let db = self.state.db.clone();
            // Dropping needs async I/O; do it on a thread with its own runtime.
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(async move {
                    // Bounded: a task of the test's runtime may still hold a connection, and that
                    // runtime waits for this thread (a current-thread runtime cannot run the task
                    // to give it back). The forced DROP below ends such a connection anyway.
                    if let Db::Postgres(pool) = db {
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), pool.close()).await;
                    }
                    if let Ok(Db::Postgres(pool)) = Db::connect(&admin_url).await {
                        let _ =
                            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&pool).await;
                        pool.close().await;
                    }
                });
            })
            .join();
        }
    }
}

/// Serves the S3 protocol from `root` on a loopback port; returns the endpoint URL.
async fn start_s3(root: std::path::PathBuf) -> String {
    std::fs::create_dir_all(root.join("gantry")).expect("bucket folder");
    let mut builder = s3s::service::S3ServiceBuilder::new(s3s_fs::FileSystem::new(&root).expect("s3s-fs"));
    builder.set_auth(s3s::auth::SimpleAuth::from_single(S3_KEY, S3_SECRET));
    let service = builder.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind s3");
    let address = listener.local_addr().expect("s3 address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                break;
            };
            let service = service.clone();
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{address}")
}

/// A multipart body; returns its content type and bytes.
pub fn multipart(fields: &[(&str, &str)], files: &[(&str, &str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "gantry-test-boundary-7d1f";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
        );
    }
    for (name, file_name, bytes) in files {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file_name}\"\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// An uncompressed tar of the given files.
pub fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, path, *bytes).expect("tar member");
    }
    builder.into_inner().expect("tar")
}

/// Declares each scenario once per backend: `sqlite::name` and `postgres_s3::name`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::harness::Backend::SqliteLocal).await
                }
            )*
        }
        mod postgres_s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::harness::Backend::PostgresS3).await
                }
            )*
        }
    };
}
