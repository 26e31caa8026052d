//! The architecture as a test: reads `src/`, builds the graph of which module names which
//! (`use crate::…`, `super::…`, inline `crate::…` paths, a parent naming its child modules), and
//! fails on any circle, on a module that imports from a layer above its own, and on a role that
//! imports another role. Test code (`#[cfg(test)]` modules) and comments are not imports, and
//! neither is a parent using its own child modules: a child is a private part of its parent
//! (`launcher` runs `launcher::process`, which uses `launcher::Launch`), while everything else a
//! module names, its parent included, is an import.
//! `docs/architecture.md` explains the layers and why this is a test rather than workspace crates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first. A module's layer is that of the longest prefix listed here; a
/// module may import from its own layer and the ones below it, never from one above.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "core: pure rules and small shared pieces",
        &["domain", "shared", "crd", "artifact", "secrets", "http", "telemetry"],
    ),
    ("persistence: database and object storage", &["db", "storage"]),
    (
        "services: events, compute backends, the launcher, authentication, live following",
        &["events", "compute", "launcher", "auth", "follow", "retention"],
    ),
    ("the HTTP API: state, extractors, errors, endpoints (handler, flow and types)", &["api"]),
    ("operations: the admin port", &["ops"]),
    ("roles", &["serve", "gateway", "admin", "controller"]),
    ("the command line", &["cli", "main", "lib"]),
];

/// The roles: none of them imports another.
const ROLES: &[&str] = &["serve", "gateway", "admin", "controller"];

type Module = String;

/// One import: from a module to another, with the line that shows it.
#[derive(Clone, Debug)]
struct Edge {
    from: Module,
    to: Module,
    at: String,
}

#[derive(Default)]
struct Graph {
    modules: BTreeSet<Module>,
    edges: Vec<Edge>,
}

impl Graph {
    fn targets(&self) -> BTreeMap<&str, BTreeSet<&str>> {
        let mut targets: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for module in &self.modules {
            targets.entry(module).or_default();
        }
        for edge in &self.edges {
            targets.entry(&edge.from).or_default().insert(&edge.to);
        }
        targets
    }

    /// The strongly connected components with more than one module (Tarjan's algorithm).
    fn circles(&self) -> Vec<Vec<String>> {
        struct State<'a> {
            targets: BTreeMap<&'a str, BTreeSet<&'a str>>,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            on_stack: BTreeSet<&'a str>,
            next: usize,
            found: Vec<Vec<String>>,
        }
        fn visit<'a>(state: &mut State<'a>, node: &'a str) {
            state.index.insert(node, state.next);
            state.low.insert(node, state.next);
            state.next += 1;
            state.stack.push(node);
            state.on_stack.insert(node);
            let targets: Vec<&str> = state.targets.get(node).into_iter().flatten().copied().collect();
            for target in targets {
                if !state.index.contains_key(target) {
                    visit(state, target);
                    let low = state.low[node].min(state.low[target]);
                    state.low.insert(node, low);
                } else if state.on_stack.contains(target) {
                    let low = state.low[node].min(state.index[target]);
                    state.low.insert(node, low);
                }
            }
            if state.low[node] == state.index[node] {
                let mut component = Vec::new();
                while let Some(top) = state.stack.pop() {
                    state.on_stack.remove(top);
                    component.push(top.to_string());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    state.found.push(component);
                }
            }
        }
        let targets = self.targets();
        let nodes: Vec<&str> = targets.keys().copied().collect();
        let mut state = State {
            targets,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            next: 0,
            found: Vec::new(),
        };
        for node in nodes {
            if !state.index.contains_key(node) {
                visit(&mut state, node);
            }
        }
        state.found
    }

    /// Every broken rule, in words: circles (with the imports that close them), imports from a
    /// higher layer, roles importing roles.
    fn problems(&self) -> Vec<String> {
        let mut problems = BTreeSet::new();
        for circle in self.circles() {
            let members: BTreeSet<&str> = circle.iter().map(String::as_str).collect();
            let inside: Vec<String> = self
                .edges
                .iter()
                .filter(|e| members.contains(e.from.as_str()) && members.contains(e.to.as_str()))
                .map(|e| format!("    {} -> {} ({})", e.from, e.to, e.at))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            problems.insert(format!("circle between {}:\n{}", circle.join(", "), inside.join("\n")));
        }
        for edge in &self.edges {
            let (from, to) = (layer_of(&edge.from), layer_of(&edge.to));
            if to > from {
                problems.insert(format!(
                    "{} (layer {}) imports {} from the layer above, {}: {}",
                    edge.from, LAYERS[from].0, edge.to, LAYERS[to].0, edge.at
                ));
            }
            if let (Some(a), Some(b)) = (role_of(&edge.from), role_of(&edge.to))
                && a != b
            {
                problems.insert(format!("role {a} imports role {b}: {}", edge.at));
            }
        }
        problems.into_iter().collect()
    }
}

fn longest_prefix<'a>(module: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates.into_iter().filter(|p| module == *p || module.starts_with(&format!("{p}::"))).max_by_key(|p| p.len())
}

fn layer_of(module: &str) -> usize {
    let all = LAYERS.iter().flat_map(|(_, prefixes)| prefixes.iter().copied());
    let prefix =
        longest_prefix(module, all).unwrap_or_else(|| panic!("module {module} is in no layer: add it to LAYERS"));
    LAYERS.iter().position(|(_, prefixes)| prefixes.contains(&prefix)).expect("the prefix came from LAYERS")
}

fn role_of(module: &str) -> Option<&'static str> {
    longest_prefix(module, ROLES.iter().copied())
}

/// The module a file under `src/` defines (`api/jobs.rs` → `api::jobs`).
fn module_of(relative: &Path) -> Module {
    relative.with_extension("").to_string_lossy().replace('/', "::")
}

/// The code of a file without comments, string and character literals, and test modules.
fn code_of(source: &str) -> String {
    let blanked = blank_literals(source);
    let mut code = String::new();
    let mut lines = blanked.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines.peek().is_some_and(|next| next.trim_start().starts_with("mod ") || next.contains(" mod "))
        {
            skip_block(&mut lines);
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The source with the insides of comments, strings and character literals replaced by spaces
/// (line breaks kept, so line numbers stay true).
fn blank_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('"');
            i = j + 1;
            while i < chars.len() {
                if chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
                    out.push('"');
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && (chars.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A character literal ('x' or an escape); a lifetime has no closing quote.
            out.push('\'');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Skips the lines of the item that starts at the next line (a `mod … { … }` or `mod …;`).
fn skip_block<'a>(lines: &mut std::iter::Peekable<impl Iterator<Item = &'a str>>) {
    let mut depth = 0i32;
    let mut opened = false;
    for line in lines.by_ref() {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if (opened && depth <= 0) || (!opened && line.trim_end().ends_with(';')) {
            return;
        }
    }
}

/// Expands a `use` tree (`crate::{a, b::{c, d}}`) into its paths.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else { return vec![tree] };
    let prefix = &tree[..open];
    let close = tree.rfind('}').filter(|close| *close > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            expand_use(p).into_iter().map(move |e| {
                if e == "self" { prefix.trim_end_matches("::").to_string() } else { format!("{prefix}{e}") }
            })
        })
        .collect()
}

/// The module a path names, seen from `module` (`super::x`, `crate::a::b::Item`, `child::f`):
/// the longest known module the path starts with.
fn resolve(module: &str, path: &str, modules: &BTreeSet<Module>, children: &BTreeSet<String>) -> Option<Module> {
    let mut segments: Vec<&str> = path.split("::").map(|s| s.split(" as ").next().unwrap_or(s)).collect();
    let mut base: Vec<&str> = module.split("::").collect();
    match segments.first().copied() {
        Some("crate") | Some("gantry") => {
            segments.remove(0);
            base.clear();
        }
        Some("self") => {
            segments.remove(0);
        }
        Some("super") => {
            while segments.first() == Some(&"super") {
                segments.remove(0);
                base.pop();
            }
        }
        Some(first) if children.contains(first) => {}
        _ => return None,
    }
    let mut full: Vec<&str> = base;
    full.extend(segments);
    (1..=full.len()).rev().map(|n| full[..n].join("::")).find(|candidate| modules.contains(candidate))
}

/// The graph of one source tree: `files` maps each path below `src/` to its text.
fn graph_of(files: &BTreeMap<String, String>) -> Graph {
    let use_statement =
        regex::Regex::new(r"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+([^;]+);").expect("a valid pattern");
    let inline = regex::Regex::new(r"\b(?:crate|super|gantry)(?:::[A-Za-z_][A-Za-z0-9_]*)+").expect("a valid pattern");
    let declared = regex::Regex::new(r"\bmod\s+([a-z_][a-z0-9_]*)\s*;").expect("a valid pattern");
    let mut graph = Graph::default();
    let codes: BTreeMap<Module, (String, String)> = files
        .iter()
        .filter(|(path, _)| path.ends_with(".rs"))
        .map(|(path, text)| (module_of(Path::new(path)), (path.clone(), code_of(text))))
        .collect();
    graph.modules = codes.keys().cloned().collect();
    for (module, (path, code)) in &codes {
        let children: BTreeSet<String> = declared.captures_iter(code).map(|c| c[1].to_string()).collect();
        let mut found: Vec<(String, usize)> = Vec::new();
        for captures in use_statement.captures_iter(code) {
            let at = code[..captures.get(0).expect("whole match").start()].lines().count() + 1;
            for expanded in expand_use(&captures[1]) {
                found.push((expanded, at));
            }
        }
        let without_uses =
            use_statement.replace_all(code, |c: &regex::Captures| "\n".repeat(c[0].lines().count().saturating_sub(1)));
        for (number, line) in without_uses.lines().enumerate() {
            for path in inline.find_iter(line) {
                found.push((path.as_str().to_string(), number + 1));
            }
            for child in &children {
                if line.contains(&format!("{child}::")) && !line.trim_start().starts_with("mod ") {
                    found.push((child.clone(), number + 1));
                }
            }
        }
        let children_full: BTreeSet<String> = children.iter().cloned().collect();
        for (target_path, line) in found {
            if let Some(target) = resolve(module, &target_path, &graph.modules, &children_full)
                && &target != module
                && !target.starts_with(&format!("{module}::"))
            {
                graph.edges.push(Edge { from: module.clone(), to: target, at: format!("src/{path}:{line}") });
            }
        }
    }
    graph
}

fn read_tree(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            read_tree(root, &path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("below src/").to_string_lossy().into_owned();
            files.insert(relative, std::fs::read_to_string(&path).expect("a source file is text"));
        }
    }
}

#[test]
fn the_module_graph_has_no_circle_and_goes_down_the_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    read_tree(&root, &root, &mut files);
    let graph = graph_of(&files);
    assert!(graph.edges.len() > 100, "the reader found only {} imports: it is broken", graph.edges.len());
    let problems = graph.problems();
    assert!(problems.is_empty(), "{} problems in the module graph:\n{}", problems.len(), problems.join("\n"));
}

/// The roles sit beside each other at the top of `src/`, never inside a service's folder (as the
/// controller once did, in `compute/`), and nothing but the command line names one.
#[test]
fn every_role_is_a_top_level_module_that_only_the_command_line_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for role in ROLES {
        assert!(!role.contains("::"), "the role {role} lives inside another module");
        assert!(root.join(format!("{role}.rs")).is_file(), "the role {role} has no src/{role}.rs");
    }
    let mut files = BTreeMap::new();
    read_tree(&root, &root, &mut files);
    let graph = graph_of(&files);
    let naming: Vec<String> = graph
        .edges
        .iter()
        .filter(|edge| role_of(&edge.to).is_some() && role_of(&edge.from) != role_of(&edge.to))
        .filter(|edge| !["cli", "main", "lib"].contains(&edge.from.as_str()))
        .map(|edge| format!("{} names the role {} ({})", edge.from, edge.to, edge.at))
        .collect();
    assert!(naming.is_empty(), "{}", naming.join("\n"));
}

/// A file holds one concept. Past 800 lines it is named as a concept that grew, to look at (a
/// warning on the test's output, not a reason to cut a concept in two); past 1,500 it fails:
/// no concept here needs that many lines in one place.
#[test]
fn files_past_800_lines_are_named_and_none_passes_1500() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    read_tree(&root, &root, &mut files);
    let over = |lines: usize| -> Vec<String> {
        files
            .iter()
            .filter(|(_, text)| text.lines().count() > lines)
            .map(|(path, text)| format!("src/{path}: {} lines", text.lines().count()))
            .collect()
    };
    for grown in over(800) {
        eprintln!("warning: a concept that grew past 800 lines: {grown}");
    }
    let long = over(1500);
    assert!(long.is_empty(), "split these files by concept:\n{}", long.join("\n"));
}

fn planted(files: &[(&str, &str)]) -> Graph {
    graph_of(&files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect())
}

#[test]
fn a_planted_circle_is_found_through_use_trees_super_and_inline_paths() {
    let graph = planted(&[
        ("api.rs", "mod jobs;\nmod files;\n"),
        ("api/jobs.rs", "use super::{files::{self, upload}};\nfn f() {}\n"),
        ("api/files.rs", "fn g() { crate::api::jobs::f() }\n"),
        ("db.rs", "use crate::domain::x;\n"),
        (
            "domain.rs",
            "// use crate::db; is a comment\nfn h() { let s = \"crate::db::x\"; }\n#[cfg(test)]\nmod tests {\n    use crate::db;\n}\n",
        ),
    ]);
    let circles = graph.circles();
    assert_eq!(circles, vec![vec!["api::files".to_string(), "api::jobs".to_string()]]);
    // Comments, string literals and test modules are not imports.
    let problems = graph.problems();
    assert!(problems.iter().any(|p| p.starts_with("circle between api::files, api::jobs")), "{problems:?}");
}

#[test]
fn a_planted_import_from_a_higher_layer_and_between_roles_is_refused() {
    let graph = planted(&[
        ("db.rs", "fn f() { crate::api::answer() }\n"),
        ("api.rs", "use crate::db;\n"),
        ("serve.rs", "use crate::gateway::ClusterArgs;\n"),
        ("gateway.rs", "pub struct ClusterArgs;\n"),
    ]);
    let problems = graph.problems();
    assert!(problems.iter().any(|p| p.starts_with("db (layer persistence")), "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("role serve imports role gateway")), "{problems:?}");
    // The db -> api -> db loop is a circle as well.
    assert!(problems.iter().any(|p| p.starts_with("circle between api, db")), "{problems:?}");
}

#[test]
fn a_parent_using_its_children_is_composition_but_a_sibling_loop_through_it_is_a_circle() {
    let graph = planted(&[
        ("compute.rs", "pub mod local;\npub mod kube;\nfn f() { local::start(); kube::start() }\n"),
        ("compute/local.rs", "use super::Queue;\npub fn start() {}\n"),
        ("compute/kube.rs", "use super::Queue;\npub fn start() {}\n"),
    ]);
    assert!(graph.circles().is_empty(), "{:?}", graph.circles());
    let sibling = planted(&[
        ("compute.rs", "pub mod local;\npub mod kube;\n"),
        ("compute/local.rs", "use super::kube::Names;\npub fn start() {}\n"),
        ("compute/kube.rs", "pub struct Names;\nfn f() { super::local::start() }\n"),
    ]);
    assert_eq!(sibling.circles(), vec![vec!["compute::kube".to_string(), "compute::local".to_string()]]);
}
