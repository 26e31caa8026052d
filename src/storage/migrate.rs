//! One-time moves of stored objects to a newer layout, run at start-up before requests are
//! served. Earlier versions kept a user's files per custom function
//! (`users/<user>/functions/<title>/data/`); users' code expects one area per user shared by all
//! of their custom functions (reference-contract §1.19), so those files move into it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Error, ObjectInfo, Storage, keys};

/// Name under which the database records that the merge below completed.
pub const USER_AREA_MERGE: &str = "custom-function-files-per-user";

/// What happens to one object of the old layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Move `from` to `to`: it is the newest object claiming that name.
    Move { from: String, to: String },
    /// Remove `key`: a newer object of the same name (`kept`) wins.
    Drop { key: String, kept: String },
}

/// Plans the merge of per-function user areas into each user's area. Where several objects
/// claim one name (two functions had a file of the same name, or the user's area already has
/// it), the newest wins; on equal times the one already in place, then the later key.
pub fn plan_user_area_merge(objects: &[ObjectInfo]) -> Vec<Step> {
    let existing: HashMap<&str, &ObjectInfo> = objects.iter().map(|o| (o.key.as_str(), o)).collect();
    let mut claims: BTreeMap<String, Vec<&ObjectInfo>> = BTreeMap::new();
    for object in objects {
        if let Some(to) = keys::legacy_custom_user_file(&object.key) {
            claims.entry(to).or_default().push(object);
        }
    }
    let mut steps = Vec::new();
    for (to, mut sources) in claims {
        sources.sort_by(|a, b| (a.modified, &a.key).cmp(&(b.modified, &b.key)));
        let newest = sources.last().expect("every claim has a source");
        let winner = match existing.get(to.as_str()) {
            Some(current) if current.modified >= newest.modified => current.key.clone(),
            _ => newest.key.clone(),
        };
        // Drops first: a crash between the steps leaves the winner where the next run finds it.
        for source in sources.iter().filter(|s| s.key != winner) {
            steps.push(Step::Drop { key: source.key.clone(), kept: winner.clone() });
        }
        if winner != to {
            steps.push(Step::Move { from: winner, to });
        }
    }
    steps
}

/// What a merge did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MergeReport {
    pub moved: usize,
    pub dropped: usize,
}

/// Moves every file of the old per-function layout into its user's area. Safe to run again: a
/// run that was cut short continues where it stopped.
pub async fn merge_custom_user_areas(storage: &Storage) -> Result<MergeReport, Error> {
    let objects = storage.list_tree("users/").await?;
    let mut report = MergeReport::default();
    let mut users = BTreeSet::new();
    for step in plan_user_area_merge(&objects) {
        match step {
            Step::Drop { key, kept } => {
                tracing::warn!(
                    object.key = %key,
                    object.kept = %kept,
                    "user file area merge: a newer file of the same name wins; removing the older one"
                );
                storage.delete(&key).await?;
                report.dropped += 1;
            }
            Step::Move { from, to } => {
                storage.rename(&from, &to).await?;
                if let Some(user) = from.split('/').nth(1) {
                    users.insert(user.to_string());
                }
                report.moved += 1;
            }
        }
    }
    for user in users {
        storage.prune_empty_folders(&format!("users/{user}/functions/")).await?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(key: &str, modified: i64) -> ObjectInfo {
        ObjectInfo { key: key.into(), modified }
    }

    #[test]
    fn files_of_different_functions_move_into_the_users_area() {
        let steps = plan_user_area_merge(&[
            object("users/alice/functions/a/data/out.tar", 1),
            object("users/alice/functions/b/data/in.txt", 2),
            object("users/bob/functions/a/data/out.tar", 3),
            object("users/alice/providers/ibm/f/data/x", 4),
            object("providers/ibm/f/data/y", 5),
        ]);
        assert_eq!(
            steps,
            [
                Step::Move { from: "users/alice/functions/b/data/in.txt".into(), to: "users/alice/data/in.txt".into() },
                Step::Move {
                    from: "users/alice/functions/a/data/out.tar".into(),
                    to: "users/alice/data/out.tar".into()
                },
                Step::Move { from: "users/bob/functions/a/data/out.tar".into(), to: "users/bob/data/out.tar".into() },
            ]
        );
    }

    #[test]
    fn a_name_clash_keeps_the_newest() {
        let steps = plan_user_area_merge(&[
            object("users/alice/functions/a/data/out.tar", 5),
            object("users/alice/functions/b/data/out.tar", 9),
            object("users/alice/data/out.tar", 7),
        ]);
        assert_eq!(
            steps,
            [
                Step::Drop {
                    key: "users/alice/functions/a/data/out.tar".into(),
                    kept: "users/alice/functions/b/data/out.tar".into()
                },
                Step::Move {
                    from: "users/alice/functions/b/data/out.tar".into(),
                    to: "users/alice/data/out.tar".into()
                },
            ]
        );
        let kept_in_place = plan_user_area_merge(&[
            object("users/alice/functions/a/data/out.tar", 5),
            object("users/alice/data/out.tar", 7),
        ]);
        assert_eq!(
            kept_in_place,
            [Step::Drop {
                key: "users/alice/functions/a/data/out.tar".into(),
                kept: "users/alice/data/out.tar".into()
            }]
        );
    }
}
