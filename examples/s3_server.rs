//! A real S3 protocol server (s3s-fs, the one the gateway suite runs in-process) as a program of
//! its own, for `bench/jobs.sh` to measure file transfers through S3 storage: serves the folder
//! `ROOT` (each subfolder a bucket) on `ADDRESS` with one key pair, and prints its URL.
//!
//! usage: cargo run --release --example s3_server -- ROOT ADDRESS ACCESS_KEY SECRET_KEY

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, address, key, secret] = args.as_slice() else {
        return Err("usage: s3_server ROOT ADDRESS ACCESS_KEY SECRET_KEY".into());
    };
    let files = s3s_fs::FileSystem::new(root).map_err(|e| format!("cannot serve {root}: {e:?}"))?;
    let mut builder = s3s::service::S3ServiceBuilder::new(files);
    builder.set_auth(s3s::auth::SimpleAuth::from_single(key.as_str(), secret.as_str()));
    let service = builder.build();
    let listener = tokio::net::TcpListener::bind(address.as_str()).await?;
    println!("s3 listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let service = service.clone();
        tokio::spawn(async move {
            let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}
