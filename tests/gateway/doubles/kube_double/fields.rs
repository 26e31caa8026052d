//! Field ownership, as the API server keeps it in `metadata.managedFields`: server-side apply
//! (`application/apply-patch+yaml`) sets the fields it sends, removes the ones its manager
//! applied before and no longer sends (unless another manager owns them too), and answers 409
//! when it would change a field another manager owns, unless forced (then that manager loses
//! it); every other write (merge or JSON patch, replace) makes its manager (`fieldManager`, else
//! the client's user agent) the owner of the fields it changed. Simplified where nothing here
//! needs more: lists are atomic (one field each), and creation by POST records no owner.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::{ApiError, Target};

type Path = Vec<String>;

/// The metadata the server sets; nobody owns it.
const SERVER_METADATA: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Who wrote, how, and through which endpoint.
#[derive(Debug, Clone)]
pub(super) struct Writer {
    pub(super) manager: String,
    pub(super) target: Target,
    /// The resource has a status subresource (so writes to the main resource leave `.status`).
    pub(super) status_subresource: bool,
}

impl Writer {
    fn subresource(&self) -> Option<&'static str> {
        (self.target == Target::Status).then_some("status")
    }

    /// Whether a write through this endpoint owns `path`.
    fn reaches(&self, path: &[String]) -> bool {
        let first = path.first().map(String::as_str).unwrap_or_default();
        match self.target {
            Target::Status => first == "status",
            Target::Main => match first {
                "apiVersion" | "kind" => false,
                "status" => !self.status_subresource,
                "metadata" => !path.get(1).is_some_and(|field| SERVER_METADATA.contains(&field.as_str())),
                _ => true,
            },
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    subresource: Option<String>,
    api_version: String,
    time: String,
    fields: BTreeSet<Path>,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager && self.operation == operation && self.subresource.as_deref() == subresource
    }

    fn to_value(&self) -> Value {
        let mut entry = json!({
            "manager": self.manager, "operation": self.operation, "apiVersion": self.api_version,
            "time": self.time, "fieldsType": "FieldsV1", "fieldsV1": fields_v1(&self.fields),
        });
        if let Some(subresource) = &self.subresource {
            entry["subresource"] = json!(subresource);
        }
        entry
    }
}

fn entries(object: &Value) -> Vec<Entry> {
    let listed = object["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    listed
        .iter()
        .map(|entry| {
            let text = |key: &str| entry[key].as_str().unwrap_or_default().to_string();
            let mut fields = BTreeSet::new();
            read_fields_v1(&entry["fieldsV1"], &mut Vec::new(), &mut fields);
            Entry {
                manager: text("manager"),
                operation: text("operation"),
                subresource: entry["subresource"].as_str().filter(|s| !s.is_empty()).map(str::to_string),
                api_version: text("apiVersion"),
                time: text("time"),
                fields,
            }
        })
        .collect()
}

fn store_entries(object: &mut Value, entries: &[Entry]) {
    let kept: Vec<Value> = entries.iter().filter(|e| !e.fields.is_empty()).map(Entry::to_value).collect();
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    if kept.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(kept));
    }
}

/// `{"f:status": {"f:phase": {}}}` from the leaf paths.
fn fields_v1(fields: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut node = &mut root;
        for key in path {
            let child = node.entry(format!("f:{key}")).or_insert_with(|| json!({}));
            node = child.as_object_mut().expect("field sets are built of objects");
        }
    }
    Value::Object(root)
}

fn read_fields_v1(node: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = node.as_object() else { return };
    let children: Vec<(&String, &Value)> = map.iter().filter(|(key, _)| key.starts_with("f:")).collect();
    if (children.is_empty() || map.contains_key(".")) && !prefix.is_empty() {
        out.insert(prefix.clone());
    }
    for (key, child) in children {
        prefix.push(key[2..].to_string());
        read_fields_v1(child, prefix, out);
        prefix.pop();
    }
}

/// The leaf fields of `value` a write through `writer` reaches: scalars, lists (atomic) and
/// empty objects; nulls are not fields.
fn leaves(value: &Value, writer: &Writer) -> BTreeSet<Path> {
    fn walk(value: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
        match value {
            Value::Null => {}
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    prefix.push(key.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => {
                out.insert(prefix.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(value, &mut Vec::new(), &mut out);
    out.retain(|path| !path.is_empty() && writer.reaches(path));
    out
}

fn overlap(a: &[String], b: &[String]) -> bool {
    a.iter().zip(b).all(|(x, y)| x == y)
}

fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(object, |value, key| value.get(key.as_str())).filter(|value| !value.is_null())
}

fn set_at(object: &mut Value, path: &[String], value: Value) {
    let mut node = object;
    for key in &path[..path.len() - 1] {
        if !node.get(key.as_str()).is_some_and(Value::is_object) {
            node[key.as_str()] = json!({});
        }
        node = &mut node[key.as_str()];
    }
    node[path[path.len() - 1].as_str()] = value;
}

fn remove_at(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else { return };
    let parent = parents.iter().try_fold(object, |value, key| value.get_mut(key.as_str()));
    if let Some(map) = parent.and_then(Value::as_object_mut) {
        map.remove(last);
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Server-side apply of `applied` to the stored `object` by `writer`: the object as it is to be
/// stored, with its `managedFields`, or 409 naming the fields other managers own.
pub(super) fn apply(object: Value, applied: &Value, writer: &Writer, force: bool) -> Result<Value, ApiError> {
    for required in ["apiVersion", "kind"] {
        if applied[required].as_str().is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(&format!("{required} must be set")));
        }
    }
    let subresource = writer.subresource();
    let mine = leaves(applied, writer);
    let mut owners = entries(&object);
    let me = owners.iter().position(|e| e.is(&writer.manager, "Apply", subresource));
    let before = me.map(|i| owners[i].fields.clone()).unwrap_or_default();
    let changes =
        |owned: &Path| mine.iter().any(|p| overlap(p, owned) && value_at(&object, owned) != value_at(applied, owned));
    let mut conflicts = Vec::new();
    for (i, entry) in owners.iter().enumerate() {
        if Some(i) == me {
            continue;
        }
        for owned in entry.fields.iter().filter(|owned| changes(owned)) {
            let field = owned.join(".");
            conflicts.push(format!("conflict with \"{}\" using {}: .{field}", entry.manager, entry.api_version));
        }
    }
    if !conflicts.is_empty() && !force {
        let count = conflicts.len();
        let message = format!(
            "Apply failed with {count} conflict{}: {}",
            if count == 1 { "" } else { "s" },
            conflicts.join("; ")
        );
        return Err(ApiError::new(409, "Conflict", &message));
    }
    let mut new = object.clone();
    // What this manager applied before and no longer does goes, unless another owns it too.
    for dropped in before.difference(&mine) {
        let shared =
            owners.iter().enumerate().any(|(i, e)| Some(i) != me && e.fields.iter().any(|f| overlap(f, dropped)));
        if !shared {
            remove_at(&mut new, dropped);
        }
    }
    for path in &mine {
        let value = value_at(applied, path).cloned().unwrap_or(Value::Null);
        set_at(&mut new, path, value);
    }
    // Forced: the others lose what this apply changed; a field set to the same value is shared.
    for (i, entry) in owners.iter_mut().enumerate() {
        if Some(i) != me {
            entry.fields.retain(|owned| !changes(owned));
        }
    }
    let api_version = applied["apiVersion"].as_str().unwrap_or_default().to_string();
    let entry = Entry {
        manager: writer.manager.clone(),
        operation: "Apply".into(),
        subresource: subresource.map(str::to_string),
        api_version,
        time: now(),
        fields: mine,
    };
    match me {
        Some(i) => owners[i] = entry,
        None => owners.push(entry),
    }
    store_entries(&mut new, &owners);
    Ok(new)
}

/// An update (merge or JSON patch, replace) from `object` to `new` by `writer`: its manager
/// owns the fields it changed, which the others lose.
pub(super) fn update(object: &Value, mut new: Value, writer: &Writer) -> Value {
    let (old_fields, new_fields) = (leaves(object, writer), leaves(&new, writer));
    let changed: BTreeSet<Path> =
        new_fields.iter().filter(|path| value_at(object, path) != value_at(&new, path)).cloned().collect();
    let removed: Vec<&Path> = old_fields.difference(&new_fields).collect();
    let mut owners = entries(object);
    if changed.is_empty() && removed.is_empty() {
        store_entries(&mut new, &owners);
        return new;
    }
    for entry in &mut owners {
        entry.fields.retain(|owned| !changed.iter().chain(removed.iter().copied()).any(|p| overlap(p, owned)));
    }
    let subresource = writer.subresource();
    match owners.iter_mut().find(|e| e.is(&writer.manager, "Update", subresource)) {
        Some(entry) => {
            entry.fields.extend(changed);
            entry.time = now();
        }
        None => owners.push(Entry {
            manager: writer.manager.clone(),
            operation: "Update".into(),
            subresource: subresource.map(str::to_string),
            api_version: new["apiVersion"].as_str().unwrap_or_default().to_string(),
            time: now(),
            fields: changed,
        }),
    }
    store_entries(&mut new, &owners);
    new
}
