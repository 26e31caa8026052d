//! Object keys. Every argument is a sanitized name (see `domain::names`), so none contains `/`
//! or `..`.

/// The current artifact of a function; each upload gets a new key so a running job keeps
/// the artifact it started with.
pub fn artifact(program_id: &str, upload_id: &str) -> String {
    format!("artifacts/{program_id}/{upload_id}.tar")
}

/// Folder (ending with `/`) of a user's own files (the files API and a job's `DATA_PATH`):
/// one area shared by all the user's custom functions, and one per provider function given
/// as `(provider, title)` (reference-contract §1.19).
pub fn user_files(username: &str, provider_function: Option<(&str, &str)>) -> String {
    match provider_function {
        None => format!("users/{username}/data/"),
        Some((provider, title)) => format!("users/{username}/providers/{provider}/{title}/data/"),
    }
}

/// Where earlier versions kept a user's files per custom function:
/// `users/<user>/functions/<title>/data/…`. Given such a key, the key the object has in the
/// user's shared area; `None` for any other key.
pub fn legacy_custom_user_file(key: &str) -> Option<String> {
    let rest = key.strip_prefix("users/")?;
    let (username, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("functions/")?;
    let (title, rest) = rest.split_once('/')?;
    let name = rest.strip_prefix("data/")?;
    (!username.is_empty() && !title.is_empty() && !name.is_empty())
        .then(|| format!("{}{name}", user_files(username, None)))
}

/// The arguments of a job run as a pod (read through a presigned URL).
pub fn job_arguments(job_id: &str) -> String {
    format!("jobs/{job_id}/arguments.json")
}

/// The result a job saved (`RESULTS_PATH`), shipped by the launcher at exit.
pub fn job_result(job_id: &str) -> String {
    format!("jobs/{job_id}/result.json")
}

/// The user (public) log of a finished job.
pub fn job_user_log(job_id: &str) -> String {
    format!("jobs/{job_id}/user.log")
}

/// The provider (private) log of a finished provider-function job.
pub fn job_provider_log(job_id: &str) -> String {
    format!("jobs/{job_id}/provider.log")
}

/// How the job's process ended, written by the launcher last: `{"exit_code", "signal", "error",
/// "limit"}`.
pub fn job_exit(job_id: &str) -> String {
    format!("jobs/{job_id}/exit.json")
}

/// What one attempt of a job leaves (its exit record, logs and result): cleared before its next
/// attempt (a retry on a new pod, a reclaimed backfill job run again), so that attempt's are
/// never confused with them.
pub fn job_attempt(job_id: &str) -> [String; 4] {
    [job_exit(job_id), job_user_log(job_id), job_provider_log(job_id), job_result(job_id)]
}

/// Folder (ending with `/`) holding every object of one job: the keys above and anything a
/// later version adds for the job. Deleting a job deletes this folder.
pub fn job_objects(job_id: &str) -> String {
    format!("jobs/{job_id}/")
}

/// Folder (ending with `/`) of a provider's files for one of its functions.
pub fn provider_files(provider: &str, title: &str) -> String {
    format!("providers/{provider}/{title}/data/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_users_providers_and_functions() {
        assert_eq!(user_files("alice", None), "users/alice/data/");
        assert_eq!(user_files("alice", Some(("ibm", "fn"))), "users/alice/providers/ibm/fn/data/");
        assert_eq!(provider_files("ibm", "fn"), "providers/ibm/fn/data/");
        assert_eq!(artifact("p", "u"), "artifacts/p/u.tar");
    }

    #[test]
    fn every_job_object_lies_in_the_jobs_folder() {
        let folder = job_objects("j1");
        assert_eq!(folder, "jobs/j1/");
        for key in [job_arguments("j1"), job_result("j1"), job_user_log("j1"), job_provider_log("j1"), job_exit("j1")] {
            assert!(key.starts_with(&folder), "{key}");
        }
        // One job's folder is never a prefix of another's.
        assert!(!job_objects("j10").starts_with(&folder));
    }

    #[test]
    fn legacy_per_function_keys_map_into_the_users_area() {
        assert_eq!(
            legacy_custom_user_file("users/alice/functions/fn/data/out.tar").as_deref(),
            Some("users/alice/data/out.tar")
        );
        assert_eq!(
            legacy_custom_user_file("users/alice/functions/fn/data/results/j.json").as_deref(),
            Some("users/alice/data/results/j.json")
        );
        for other in [
            "users/alice/data/out.tar",
            "users/alice/providers/ibm/fn/data/x",
            "users/alice/functions/fn/data/",
            "users/alice/functions/fn/other/x",
            "providers/ibm/fn/data/x",
        ] {
            assert_eq!(legacy_custom_user_file(other), None, "{other}");
        }
    }
}
