//! Who sees and does what: owner, other user, provider admin, author of a provider function,
//! granted groups, and an inactive user.

use gantry::admin::AdminCommand;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(visibility_matrix, inactive_users_are_refused);

fn titles(list: &Value) -> Vec<String> {
    let mut titles: Vec<String> = list
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| format!("{}/{}", f["provider"].as_str().unwrap_or("-"), f["title"].as_str().unwrap()))
        .collect();
    titles.sort();
    titles
}

async fn visibility_matrix(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    // erin administers acme; alice wrote acme/tool while she was an admin, then left the group.
    gateway.provider("acme", None, "erin").await;
    gateway.admin(AdminCommand::AddAdmin { provider: "acme".into(), user: "alice".into() }).await;
    let tool = gateway.upload_function("alice", &[("title", "acme/tool"), ("entrypoint", "main.py")]).await;
    assert_eq!(tool.status, 200, "{}", tool.json);
    gateway.admin(AdminCommand::RemoveAdmin { provider: "acme".into(), user: "alice".into() }).await;
    gateway.upload_function("erin", &[("title", "acme/other"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("alice", &[("title", "mine"), ("entrypoint", "main.py")]).await;
    // carol's group may run acme/tool; dave's may only view it.
    gateway.admin(AdminCommand::AddMember { group: "runners".into(), user: "carol".into() }).await;
    gateway.admin(AdminCommand::AddMember { group: "viewers".into(), user: "dave".into() }).await;
    gateway
        .admin(AdminCommand::Grant {
            provider: "acme".into(),
            function: "tool".into(),
            group: "runners".into(),
            view: false,
            run: true,
        })
        .await;
    gateway
        .admin(AdminCommand::Grant {
            provider: "acme".into(),
            function: "tool".into(),
            group: "viewers".into(),
            view: true,
            run: false,
        })
        .await;

    // Listings: only what each caller can see; `provider` only narrows.
    assert_eq!(titles(&gateway.get("/api/v1/programs/", "alice").await.json), ["-/mine"]);
    assert_eq!(titles(&gateway.get("/api/v1/programs/?filter=catalog", "alice").await.json), Vec::<String>::new());
    assert_eq!(titles(&gateway.get("/api/v1/programs/", "erin").await.json), ["acme/other", "acme/tool"]);
    assert_eq!(
        titles(&gateway.get("/api/v1/programs/?filter=catalog", "erin").await.json),
        ["acme/other", "acme/tool"]
    );
    assert_eq!(titles(&gateway.get("/api/v1/programs/?filter=serverless", "erin").await.json), Vec::<String>::new());
    assert_eq!(titles(&gateway.get("/api/v1/programs/", "carol").await.json), ["acme/tool"]);
    assert_eq!(
        titles(&gateway.get("/api/v1/programs/?filter=catalog&provider=acme", "carol").await.json),
        ["acme/tool"]
    );
    assert_eq!(titles(&gateway.get("/api/v1/programs/?provider=other", "carol").await.json), Vec::<String>::new());
    assert_eq!(titles(&gateway.get("/api/v1/programs/", "dave").await.json), ["acme/tool"]);
    assert_eq!(titles(&gateway.get("/api/v1/programs/?filter=catalog", "dave").await.json), Vec::<String>::new());
    assert_eq!(titles(&gateway.get("/api/v1/programs/", "bob").await.json), Vec::<String>::new());

    let get_tool = |token: &'static str| {
        let gateway = &gateway;
        async move { gateway.get("/api/v1/programs/get_by_title/tool?provider=acme", token).await.status.as_u16() }
    };
    assert_eq!(
        [
            get_tool("alice").await,
            get_tool("bob").await,
            get_tool("carol").await,
            get_tool("dave").await,
            get_tool("erin").await
        ],
        [404, 404, 200, 200, 200]
    );

    let validate = |token: &'static str| {
        let gateway = &gateway;
        async move {
            gateway
                .post_json(
                    "/api/v1/programs/validate_arguments/",
                    token,
                    json!({"title": "tool", "provider": "acme", "arguments": "{}"}),
                )
                .await
                .status
                .as_u16()
        }
    };
    assert_eq!(
        [
            validate("alice").await,
            validate("bob").await,
            validate("carol").await,
            validate("dave").await,
            validate("erin").await
        ],
        [404, 404, 200, 404, 200]
    );

    // New version upload: admins and the function's author; nobody else, with the same 404.
    let upload = |token: &'static str| {
        let gateway = &gateway;
        async move {
            gateway
                .post_form(
                    "/api/v1/programs/upload/",
                    token,
                    &[("title", "tool"), ("provider", "acme"), ("description", token)],
                )
                .await
        }
    };
    let by_author = upload("alice").await;
    assert_eq!(by_author.status, 200, "{}", by_author.json);
    assert_eq!(by_author.json["description"], "alice");
    let by_carol = upload("carol").await;
    assert_eq!(by_carol.status, 404);
    assert_eq!(by_carol.message(), "Qiskit Function acme/tool doesn't exist.");
    assert_eq!(upload("erin").await.status, 200);
    // Creating a provider function needs the upload permission (admin), authorship is not enough.
    let create = gateway.upload_function("alice", &[("title", "acme/new"), ("entrypoint", "main.py")]).await;
    assert_eq!(create.status, 404);

    // Provider files: the admin and the author of that one function.
    let provider_files = |token: &'static str, function: &'static str| {
        let gateway = &gateway;
        async move {
            let reply = gateway.get(&format!("/api/v1/files/provider?function={function}&provider=acme"), token).await;
            (reply.status.as_u16(), reply.message())
        }
    };
    assert_eq!(provider_files("alice", "tool").await.0, 200);
    assert_eq!(provider_files("alice", "other").await, (404, "Provider acme doesn't exist.".into()));
    assert_eq!(provider_files("erin", "other").await.0, 200);
    assert_eq!(provider_files("erin", "missing").await, (404, "Qiskit Function acme/missing doesn't exist.".into()));
    assert_eq!(provider_files("carol", "tool").await, (404, "Provider acme doesn't exist.".into()));
    assert_eq!(provider_files("bob", "tool").await.0, 404);

    // User files of a provider function: whoever may run it.
    let user_files = |token: &'static str| {
        let gateway = &gateway;
        async move { gateway.get("/api/v1/files?function=tool&provider=acme", token).await.status.as_u16() }
    };
    assert_eq!(
        [
            user_files("alice").await,
            user_files("bob").await,
            user_files("carol").await,
            user_files("dave").await,
            user_files("erin").await
        ],
        [404, 404, 200, 404, 200]
    );
    // Own function files: only the owner.
    assert_eq!(gateway.get("/api/v1/files?function=mine", "alice").await.status, 200);
    assert_eq!(gateway.get("/api/v1/files?function=mine", "bob").await.status, 404);
}

async fn inactive_users_are_refused(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    assert_eq!(gateway.get("/api/v1/programs/", "mallory").await.status, 200);
    gateway.admin(AdminCommand::DeactivateUser { user: "mallory".into() }).await;
    let refused = gateway.get("/api/v1/programs/", "mallory").await;
    assert_eq!(refused.status, 401);
    assert!(refused.json["detail"].as_str().unwrap().contains("deactivated"));
    assert_eq!(refused.headers["www-authenticate"], "Bearer");
    gateway.admin(AdminCommand::ActivateUser { user: "mallory".into() }).await;
    assert_eq!(gateway.get("/api/v1/programs/", "mallory").await.status, 200);
    // Each token is its own user.
    gateway.upload_function("mallory", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    assert_eq!(gateway.get("/api/v1/programs/", "mallory2").await.json, json!([]));
}
