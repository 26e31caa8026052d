//! The environment a job's code runs with (client-contract §5.1): where to call back, as whom,
//! where its arguments and result live, and the function's own variables last so they may
//! override the rest.

use serde_json::{Map, Value};

/// Everything the environment is computed from.
#[derive(Debug, Clone)]
pub struct JobEnvironmentInput<'a> {
    pub job_id: &'a str,
    /// Base URL of the gateway as the job reaches it, with scheme, without trailing slash.
    pub gateway_host: &'a str,
    /// The caller's own token: the job acts as its author.
    pub token: &'a str,
    /// `local`, `ibm_cloud` or `ibm_quantum_platform`, as the caller used.
    pub channel: &'a str,
    /// The caller's instance (CRN), when sent.
    pub instance: Option<&'a str>,
    /// The job runs as a trial (`ENV_ACCESS_TRIAL`).
    pub trial: bool,
    /// The user's file area for the function.
    pub data_path: &'a str,
    pub function_size: Option<&'a str>,
    /// The compute profile of that size in the function's catalog (`gx3d-24x120x1a100p`), read
    /// by the client's `get_compute_profile()`.
    pub compute_profile: Option<&'a str>,
    pub qiskit_ibm_url: &'a str,
    /// The function's `env_vars`.
    pub function_env: &'a Map<String, Value>,
    /// The job's trace (W3C `traceparent`): the parent of the launcher's spans and, through
    /// them, of the function's own (`traceparent`, as the reference sets it, and `TRACEPARENT`).
    pub traceparent: Option<&'a str>,
    /// Where the launcher and the function send their spans (the role's `OTEL_*` variables).
    pub telemetry: &'a [(String, String)],
}

pub fn job_environment(input: &JobEnvironmentInput<'_>) -> Vec<(String, String)> {
    let data_path = input.data_path.trim_end_matches('/');
    let mut env: Vec<(String, String)> = vec![
        ("ENV_JOB_GATEWAY_HOST".into(), input.gateway_host.trim_end_matches('/').into()),
        ("ENV_JOB_GATEWAY_TOKEN".into(), input.token.into()),
        ("ENV_JOB_ID_GATEWAY".into(), input.job_id.into()),
        ("FUNCTIONS_IDENTIFIER".into(), input.job_id.into()),
        ("ENV_JOB_ARGUMENTS".into(), "{}".into()),
        ("ENV_ACCESS_TRIAL".into(), if input.trial { "True" } else { "False" }.into()),
        ("DATA_PATH".into(), data_path.into()),
        ("ARGUMENTS_PATH".into(), format!("{data_path}/arguments/{}.json", input.job_id)),
        ("RESULTS_PATH".into(), format!("{data_path}/results/{}.json", input.job_id)),
        ("QISKIT_IBM_TOKEN".into(), input.token.into()),
        ("QISKIT_IBM_CHANNEL".into(), input.channel.into()),
        ("QISKIT_IBM_URL".into(), input.qiskit_ibm_url.into()),
        ("ENV_JOB_FUNCTION_SIZE".into(), input.function_size.unwrap_or_default().into()),
        ("ENV_JOB_COMPUTE_PROFILE".into(), input.compute_profile.unwrap_or_default().into()),
    ];
    if let Some(instance) = input.instance {
        env.push(("QISKIT_IBM_INSTANCE".into(), instance.into()));
        env.push(("ENV_JOB_GATEWAY_INSTANCE".into(), instance.into()));
    }
    env.extend(input.telemetry.iter().cloned());
    if let Some(traceparent) = input.traceparent {
        env.push(("traceparent".into(), traceparent.into()));
        env.push(("TRACEPARENT".into(), traceparent.into()));
    }
    for (key, value) in input.function_env {
        let value = match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        env.retain(|(existing, _)| existing != key);
        env.push((key.clone(), value));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
        env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_job_sees_the_contract_variables_and_its_function_env_last() {
        let function_env: Map<String, Value> =
            serde_json::from_str(r#"{"MY_VAR": "x", "QISKIT_IBM_URL": "https://other"}"#).unwrap();
        let env = job_environment(&JobEnvironmentInput {
            job_id: "j1",
            gateway_host: "http://127.0.0.1:8000/",
            token: "alice",
            channel: "local",
            instance: Some("crn:v1:x"),
            trial: false,
            data_path: "/data/alice/",
            function_size: Some("M"),
            compute_profile: Some("gx3d-24x120x1a100p"),
            qiskit_ibm_url: "https://cloud.ibm.com",
            function_env: &function_env,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            telemetry: &[("OTEL_EXPORTER_OTLP_ENDPOINT".into(), "http://collector:4318".into())],
        });
        assert_eq!(lookup(&env, "ENV_JOB_GATEWAY_HOST"), Some("http://127.0.0.1:8000"));
        let trace = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!((lookup(&env, "traceparent"), lookup(&env, "TRACEPARENT")), (trace, trace));
        assert_eq!(lookup(&env, "OTEL_EXPORTER_OTLP_ENDPOINT"), Some("http://collector:4318"));
        assert_eq!(lookup(&env, "ENV_JOB_GATEWAY_TOKEN"), Some("alice"));
        assert_eq!(lookup(&env, "FUNCTIONS_IDENTIFIER"), Some("j1"));
        assert_eq!(lookup(&env, "ARGUMENTS_PATH"), Some("/data/alice/arguments/j1.json"));
        assert_eq!(lookup(&env, "RESULTS_PATH"), Some("/data/alice/results/j1.json"));
        assert_eq!(lookup(&env, "ENV_JOB_GATEWAY_INSTANCE"), Some("crn:v1:x"));
        assert_eq!(lookup(&env, "ENV_JOB_FUNCTION_SIZE"), Some("M"));
        assert_eq!(lookup(&env, "ENV_JOB_COMPUTE_PROFILE"), Some("gx3d-24x120x1a100p"));
        assert_eq!(lookup(&env, "MY_VAR"), Some("x"));
        assert_eq!(lookup(&env, "QISKIT_IBM_URL"), Some("https://other"));
        assert_eq!(env.last().unwrap().0, "QISKIT_IBM_URL");
        assert_eq!(env.iter().filter(|(k, _)| k == "QISKIT_IBM_URL").count(), 1);
    }
}
