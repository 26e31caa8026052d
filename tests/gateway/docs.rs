//! The documentation cannot drift from the code: `docs/configuration.md` lists exactly the flags
//! `gantry serve --help` shows, each with the environment variable the binary reads.

use std::collections::BTreeMap;

/// `--flag` → its help block (from its line to the next flag's), from `gantry serve --help`.
fn help_blocks() -> BTreeMap<String, String> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["serve", "--help"])
        .output()
        .expect("gantry serve --help runs");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    let mut blocks = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed.strip_prefix("-h, ").or(Some(trimmed)).filter(|t| t.starts_with("--"));
        if let Some(flag) = flag {
            if let Some((name, block)) = current.take() {
                blocks.insert(name, block);
            }
            let name = flag.split([' ', '=']).next().unwrap_or_default().to_string();
            current = Some((name, String::new()));
        }
        if let Some((_, block)) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    if let Some((name, block)) = current {
        blocks.insert(name, block);
    }
    blocks.remove("--help");
    blocks.remove("--version");
    blocks
}

/// (flag, environment variable) of each row of the configuration table.
fn documented() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    text.lines()
        .filter(|line| line.starts_with("| `--"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(|cell| cell.trim().trim_matches('`')).collect();
            (cells[1].to_string(), cells[2].to_string())
        })
        .collect()
}

#[test]
fn the_configuration_page_lists_every_flag_of_serve_with_its_variable() {
    let blocks = help_blocks();
    let rows = documented();
    assert!(rows.len() > 40, "the table was not found: {rows:?}");
    for (flag, variable) in &rows {
        let block = blocks.get(flag).unwrap_or_else(|| panic!("docs/configuration.md names {flag}, which serve lacks"));
        assert!(
            // `[env: NAME=value]`, or `[env: NAME]` for a secret whose value is never shown.
            block.contains(&format!("[env: {variable}=")) || block.contains(&format!("[env: {variable}]")),
            "docs/configuration.md says {flag} reads {variable}; serve --help says:\n{block}"
        );
    }
    let documented: Vec<&String> = rows.iter().map(|(flag, _)| flag).collect();
    for flag in blocks.keys() {
        assert!(documented.contains(&flag), "{flag} of gantry serve is missing from docs/configuration.md");
    }
}
