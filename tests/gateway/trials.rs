//! Trials under the group rules: a run by a member of one of a function's trial groups
//! (`gantry admin add-trial-group`, the reference's `trial_instances`) that holds `run` on the
//! function is a trial; the job records it and its environment says `ENV_ACCESS_TRIAL=True`.

use gantry::admin::AdminCommand;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway, tar_of};

both_backends!(group_memberships_decide_trials);

/// Returns the job's `ENV_ACCESS_TRIAL` as its result.
const TRIAL_MAIN: &str = r#"
import json, os
os.makedirs(os.path.dirname(os.environ["RESULTS_PATH"]), exist_ok=True)
with open(os.environ["RESULTS_PATH"], "w") as handle:
    json.dump({"trial": os.environ["ENV_ACCESS_TRIAL"]}, handle)
"#;

fn grant(group: &str, view: bool, run: bool) -> AdminCommand {
    AdminCommand::Grant { provider: "acme".into(), function: "tool".into(), group: group.into(), view, run }
}

fn trial_group(group: &str, add: bool) -> AdminCommand {
    let (provider, function, group) = ("acme".to_string(), "tool".to_string(), group.to_string());
    match add {
        true => AdminCommand::AddTrialGroup { provider, function, group },
        false => AdminCommand::RemoveTrialGroup { provider, function, group },
    }
}

/// Runs `title` (of acme, or the caller's own without `provider`) and returns the job's id
/// and whether the job records a trial.
async fn run(gateway: &Gateway, user: &str, provider: Option<&str>, title: &str) -> (String, bool) {
    let reply = gateway
        .post_json(
            "/api/v1/programs/run/",
            user,
            json!({"title": title, "provider": provider, "arguments": "{}", "config": {}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{user} runs {title}: {}", reply.json);
    let id = reply.json["id"].as_str().expect("job id").to_string();
    let launch = gantry::db::jobs::launch(&gateway.state.db, &id).await.unwrap().expect("the job").info;
    (id, launch.trial)
}

async fn group_memberships_decide_trials(backend: Backend) {
    let gateway = Gateway::start(backend).await.with_runner(|_| {}).await;
    let artifact = tar_of(&[("main.py", TRIAL_MAIN.as_bytes())]);
    gateway.provider("acme", None, "erin").await;
    for (user, title) in [("erin", "acme/tool"), ("ivan", "mine")] {
        let reply = gateway
            .post_multipart(
                "/api/v1/programs/upload/",
                user,
                &[("title", title), ("entrypoint", "main.py")],
                &[("artifact", "artifact.tar", &artifact)],
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }
    // trialists: run + trial group. payers: run only. lookers: a trial group with view only.
    let said = gateway.admin(trial_group("trialists", true)).await;
    assert!(said.contains("once it is granted run"), "{said}");
    gateway.admin(grant("trialists", false, true)).await;
    gateway.admin(grant("payers", true, true)).await;
    gateway.admin(grant("lookers", true, false)).await;
    let said = gateway.admin(trial_group("lookers", true)).await;
    assert!(said.contains("once it is granted run"), "{said}");
    assert!(!gateway.admin(trial_group("trialists", true)).await.contains("granted run"));
    for (group, user) in [
        ("trialists", "carol"),
        ("payers", "dave"),
        ("payers", "frank"),
        ("lookers", "frank"),
        ("trialists", "gina"),
        ("payers", "gina"),
        ("trialists", "ivan"),
    ] {
        gateway.admin(AdminCommand::AddMember { group: group.into(), user: user.into() }).await;
    }
    // (user, what makes them run, trial)
    let table = [
        ("carol", "member of a trial group granted run", true),
        ("dave", "member of a group granted run, not a trial group", false),
        ("frank", "runs through payers; lookers is a trial group without run", false),
        ("gina", "member of a trial group and of a paying group", true),
        ("erin", "provider admin, in no trial group", false),
    ];
    let mut jobs = Vec::new();
    for (user, why, trial) in table {
        let (id, recorded) = run(&gateway, user, Some("acme"), "tool").await;
        assert_eq!(recorded, trial, "{user}: {why}");
        jobs.push((user, id, trial));
    }
    // Trial groups are the function's own: ivan's function is no trial, though he is a trialist.
    let (_, recorded) = run(&gateway, "ivan", None, "mine").await;
    assert!(!recorded, "a trial group of acme/tool does not make ivan's own function a trial");

    // The job's environment says it: ENV_ACCESS_TRIAL is True exactly for the trials.
    for (user, id, trial) in jobs {
        let job =
            gateway.wait_for_job(user, &id, 60, |job| job["status"] == "SUCCEEDED" || job["status"] == "FAILED").await;
        assert_eq!(job["status"], "SUCCEEDED", "{user}: {job}");
        let result = gateway.get(&format!("/api/v1/jobs/{id}/result/"), user).await.json;
        let result: Value = serde_json::from_str(result["result"].as_str().expect("a result")).unwrap();
        assert_eq!(result, json!({"trial": if trial { "True" } else { "False" }}), "{user}");
    }

    // Changes apply to the next run at once (the function `run` keeps in memory is forgotten).
    gateway.admin(grant("lookers", true, true)).await;
    assert!(run(&gateway, "frank", Some("acme"), "tool").await.1, "lookers now holds run");
    let said = gateway.admin(trial_group("trialists", false)).await;
    assert!(said.contains("no longer a trial group"), "{said}");
    assert!(!run(&gateway, "carol", Some("acme"), "tool").await.1, "trialists is no trial group any more");
    assert!(gateway.admin(trial_group("trialists", false)).await.contains("was not a trial group"));
    assert!(!run(&gateway, "gina", Some("acme"), "tool").await.1, "gina's trial group is gone");
    gateway.admin(grant("lookers", true, false)).await;
    assert!(!run(&gateway, "frank", Some("acme"), "tool").await.1, "lookers holds run no more");
}
