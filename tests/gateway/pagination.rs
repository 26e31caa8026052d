//! Keyset pagination of `jobs/` and `jobs/provider/` (`?cursor=` beside `offset`): walking the
//! `next` links from an empty cursor gives every matching job once, in the offset listing's
//! order, ties of creation time included; the `previous` links walk back through the same pages;
//! the links keep the filters; offset answers are what they were; a cursor the gateway did not
//! give, or one with `offset`, is a 400 in the contract's shape.

use base64::Engine;
use gantry::db::Db;
use serde_json::{Value, json};

use crate::both_backends;
use crate::harness::{Backend, Gateway};

both_backends!(
    cursor_pages_walk_every_job_once_in_both_directions,
    cursor_links_keep_the_filters_and_the_provider_listing_pages_too,
    offset_pages_answer_as_before_at_any_depth,
    a_bad_cursor_is_a_400_never_a_500,
);

/// Queues `created.len()` jobs of `user`'s function `fn` and gives them these creation times
/// (microseconds; equal ones make ties that only the id orders). Returns their ids.
async fn jobs_created_at(gateway: &Gateway, user: &str, created: &[i64]) -> Vec<String> {
    let mut ids = Vec::new();
    for when in created {
        let reply = gateway.post_json("/api/v1/programs/run/", user, json!({"title": "fn", "arguments": "{}"})).await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        let id = reply.json["id"].as_str().unwrap().to_string();
        set_created(gateway, &id, *when).await;
        ids.push(id);
    }
    gantry::db::counts::recount(&gateway.state.db).await.unwrap();
    ids
}

async fn set_created(gateway: &Gateway, id: &str, created: i64) {
    let sql = "UPDATE jobs SET created = $1 WHERE id = $2";
    let changed = match &gateway.state.db {
        Db::Sqlite(pool, _) => sqlx::query(sql).bind(created).bind(id).execute(pool).await.unwrap().rows_affected(),
        Db::Postgres(pool) => sqlx::query(sql).bind(created).bind(id).execute(pool).await.unwrap().rows_affected(),
    };
    assert_eq!(changed, 1);
}

/// The path and query of an absolute link.
fn path_of(link: &Value) -> Option<String> {
    let link = link.as_str()?;
    Some(link[link.find("/api/").expect("an API link")..].to_string())
}

fn ids(page: &Value) -> Vec<String> {
    page["results"].as_array().unwrap().iter().map(|job| job["id"].as_str().unwrap().to_string()).collect()
}

/// Follows `link` ("next" or "previous") from `first` until it is null: the pages' ids in the
/// order read, and every page's count.
async fn walk(gateway: &Gateway, user: &str, first: &str, link: &str) -> (Vec<Vec<String>>, Vec<i64>) {
    let (mut pages, mut counts) = (Vec::new(), Vec::new());
    let mut next = Some(first.to_string());
    while let Some(path) = next {
        let reply = gateway.get(&path, user).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.json);
        pages.push(ids(&reply.json));
        counts.push(reply.json["count"].as_i64().unwrap());
        next = path_of(&reply.json[link]);
        assert!(pages.len() < 50, "the walk does not end");
    }
    (pages, counts)
}

async fn every_job_by_offset(gateway: &Gateway, user: &str, query: &str) -> Vec<String> {
    let reply = gateway.get(&format!("/api/v1/jobs/?limit=0{query}"), user).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    ids(&reply.json)
}

async fn cursor_pages_walk_every_job_once_in_both_directions(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway.upload_function("bob", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    // Eight jobs, five of them in two ties, and bob's job between them (never listed for alice).
    let base = 1_750_000_000_000_000;
    let created: Vec<i64> = [0, 5, 5, 5, 9, 12, 12, 20].iter().map(|s| base + s * 1_000_000).collect();
    let mine = jobs_created_at(&gateway, "alice", &created).await;
    jobs_created_at(&gateway, "bob", &[base + 5_000_000]).await;

    let expected = every_job_by_offset(&gateway, "alice", "").await;
    assert_eq!(expected.len(), 8);
    let mut sorted = expected.clone();
    sorted.sort();
    let mut all = mine.clone();
    all.sort();
    assert_eq!(sorted, all);

    let (pages, counts) = walk(&gateway, "alice", "/api/v1/jobs/?limit=3&cursor=", "next").await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3, 2], "{pages:?}");
    assert_eq!(pages.concat(), expected, "the pages hold every job once, in the listing's order");
    assert_eq!(counts, vec![8, 8, 8]);

    // From the last page back: the same pages, in reverse, and the first has no previous link.
    let first = gateway.get("/api/v1/jobs/?limit=3&cursor=", "alice").await.json;
    let second = gateway.get(&path_of(&first["next"]).unwrap(), "alice").await.json;
    let third = gateway.get(&path_of(&second["next"]).unwrap(), "alice").await.json;
    assert_eq!(third["next"], Value::Null, "{third}");
    assert_eq!(first["previous"], Value::Null, "{first}");
    let (back, _) = walk(&gateway, "alice", &path_of(&third["previous"]).unwrap(), "previous").await;
    assert_eq!(back, vec![pages[1].clone(), pages[0].clone()]);

    // A page size that divides the jobs exactly: the last full page says whether more follow.
    let (pages, _) = walk(&gateway, "alice", "/api/v1/jobs/?limit=4&cursor=", "next").await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4]);
    // limit=0: every job in one page.
    let whole = gateway.get("/api/v1/jobs/?limit=0&cursor=", "alice").await.json;
    assert_eq!((ids(&whole), &whole["next"], &whole["previous"]), (expected.clone(), &Value::Null, &Value::Null));

    // A job that arrives while walking appears on the newest side only: the walk onwards from a
    // cursor is not shifted by it (an offset walk would show a job twice).
    let first = gateway.get("/api/v1/jobs/?limit=3&cursor=", "alice").await.json;
    jobs_created_at(&gateway, "alice", &[base + 30_000_000]).await;
    let onwards = gateway.get(&path_of(&first["next"]).unwrap(), "alice").await.json;
    assert_eq!(ids(&onwards), expected[3..6].to_vec());
    assert_eq!(onwards["count"], 9);
}

async fn cursor_links_keep_the_filters_and_the_provider_listing_pages_too(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let base = 1_750_000_000_000_000;
    let created: Vec<i64> = (0..7).map(|s| base + s * 60_000_000).collect();
    let mine = jobs_created_at(&gateway, "alice", &created).await;
    // Stop three of them: the status filter then picks four.
    for id in &mine[..3] {
        assert_eq!(gateway.post_json(&format!("/api/v1/jobs/{id}/stop/"), "alice", json!({})).await.status, 200);
    }
    let after = "2025-06-15T15:08:20Z"; // base + 100 s: the first two jobs are before it
    let query = format!("&status=queued&function=fn&created_after={after}");
    let expected = every_job_by_offset(&gateway, "alice", &query).await;
    assert_eq!(expected.len(), 4, "{expected:?}");

    let first = format!("/api/v1/jobs/?limit=3{query}&cursor=");
    let page = gateway.get(&first, "alice").await.json;
    let next = path_of(&page["next"]).unwrap();
    assert!(next.starts_with("/api/v1/jobs/?limit=3&cursor="), "{next}");
    assert!(
        next.ends_with("&function=fn&status=queued&created_after=2025-06-15T15%3A08%3A20Z"),
        "the filters ride along: {next}"
    );
    let (pages, counts) = walk(&gateway, "alice", &first, "next").await;
    assert_eq!(pages.concat(), expected);
    assert_eq!(counts, vec![4, 4]);

    // jobs/provider/ pages the same way, its `provider` kept in the links.
    gateway.provider("acme", None, "erin").await;
    gateway.upload_function("erin", &[("title", "acme/tool"), ("entrypoint", "main.py")]).await;
    gateway.admin(gantry::admin::AdminCommand::AddMember { group: "users".into(), user: "alice".into() }).await;
    gateway.grant_run("acme", "tool", "users").await;
    for _ in 0..5 {
        let reply = gateway
            .post_json(
                "/api/v1/programs/run/",
                "alice",
                json!({"title": "tool", "provider": "acme", "arguments": "{}"}),
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }
    let offset = gateway.get("/api/v1/jobs/provider/?provider=acme&limit=0", "erin").await.json;
    let first = "/api/v1/jobs/provider/?provider=acme&limit=2&cursor=";
    let page = gateway.get(first, "erin").await.json;
    assert!(path_of(&page["next"]).unwrap().ends_with("&provider=acme"), "{page}");
    let (pages, counts) = walk(&gateway, "erin", first, "next").await;
    assert_eq!(pages.concat(), ids(&offset));
    assert_eq!(counts, vec![5, 5, 5]);
}

async fn offset_pages_answer_as_before_at_any_depth(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    let base = 1_750_000_000_000_000;
    let created: Vec<i64> = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3].iter().map(|s| base + s * 1_000_000).collect();
    jobs_created_at(&gateway, "alice", &created).await;
    let whole = every_job_by_offset(&gateway, "alice", "").await;
    // Every page past the first picks its ids first (the deep-offset path): the same jobs.
    let mut paged = Vec::new();
    for offset in (0..10).step_by(3) {
        let page = gateway.get(&format!("/api/v1/jobs/?limit=3&offset={offset}"), "alice").await.json;
        assert_eq!(page["count"], 10);
        let next = page["next"].as_str().map(|link| link[link.find("/api/").unwrap()..].to_string());
        let expected_next = (offset + 3 < 10).then(|| format!("/api/v1/jobs/?limit=3&offset={}", offset + 3));
        assert_eq!(next, expected_next, "offset links carry only limit and offset");
        paged.extend(ids(&page));
        // Every field of a job is the same on a deep page as on the whole listing.
        let whole_page = gateway.get("/api/v1/jobs/?limit=0", "alice").await.json;
        for job in page["results"].as_array().unwrap() {
            let same = whole_page["results"].as_array().unwrap().iter().find(|j| j["id"] == job["id"]).unwrap();
            assert_eq!(job, same);
        }
    }
    assert_eq!(paged, whole);
    let past = gateway.get("/api/v1/jobs/?limit=3&offset=12", "alice").await.json;
    assert_eq!((past["count"].as_i64(), ids(&past).len()), (Some(10), 0), "{past}");
}

async fn a_bad_cursor_is_a_400_never_a_500(backend: Backend) {
    let gateway = Gateway::start(backend).await;
    gateway.upload_function("alice", &[("title", "fn"), ("entrypoint", "main.py")]).await;
    gateway.provider("acme", None, "erin").await;
    jobs_created_at(&gateway, "alice", &[1_750_000_000_000_000]).await;
    let encoded = |text: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
    let injected = encoded("o:1:x' OR '1'='1");
    let huge = encoded("o:123456789012345678901234567890:abc");
    for path in ["/api/v1/jobs/?", "/api/v1/jobs/provider/?provider=acme&"] {
        for cursor in ["not-a-cursor", "%25%25", &injected, &huge, "bz0xOmFiYw"] {
            let reply = gateway
                .get(&format!("{path}cursor={cursor}"), if path.contains("provider") { "erin" } else { "alice" })
                .await;
            assert_eq!(reply.status, 400, "{cursor}: {}", reply.json);
            assert_eq!(reply.message(), gantry::domain::paging::INVALID_CURSOR, "{cursor}");
            assert_eq!(reply.json.as_object().unwrap().len(), 1, "the contract's shape: {}", reply.json);
        }
        let both = gateway
            .get(&format!("{path}cursor=&offset=0"), if path.contains("provider") { "erin" } else { "alice" })
            .await;
        assert_eq!(both.status, 400, "{}", both.json);
        assert!(both.message().contains("'cursor' and 'offset' cannot be used together"), "{}", both.json);
    }
    // A cursor from this gateway still works when its job is gone (a place in the order, not a job).
    let gone = encoded("o:1750000000000001:ffffffff-0000-0000-0000-000000000000");
    let reply = gateway.get(&format!("/api/v1/jobs/?cursor={gone}"), "alice").await;
    assert_eq!((reply.status.as_u16(), ids(&reply.json).len()), (200, 1), "{}", reply.json);
}
