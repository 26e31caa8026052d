// Rebuild when a migration changes: `sqlx::migrate!` embeds them at compile time. The web
// console's files (`console/`) are embedded too: this lists them for `api::console`.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=console");
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("console");
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    files.sort();
    let mut out =
        String::from("/// The console's files, by path below `console/`.\npub static ASSETS: &[(&str, &[u8])] = &[\n");
    for (name, path) in files {
        out.push_str(&format!("    ({name:?}, include_bytes!({path:?})),\n"));
    }
    out.push_str("];\n");
    let target = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("console_assets.rs");
    std::fs::write(target, out).expect("write the console's asset list");
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if let Ok(relative) = path.strip_prefix(root) {
            let name = relative.to_string_lossy().replace('\\', "/");
            if !name.starts_with('.') && !name.contains("/.") {
                files.push((name, path.to_string_lossy().into_owned()));
            }
        }
    }
}
