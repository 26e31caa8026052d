//! Log routing of a running job (reference contract §7.7): which output line goes to the user
//! log and which to the provider log, with which prefix removed, and the tail-keeping size cap
//! of each stored log. Pure: the launcher feeds lines in and writes the renders out.

use std::collections::VecDeque;

/// Marks a line meant for the caller of a provider function.
const PUBLIC_TAG: &str = "[PUBLIC]";
/// Marks a line meant only for the provider.
const PRIVATE_TAG: &str = "[PRIVATE]";

/// Which stored log a line belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// The log the job's author reads (`/jobs/{id}/logs/`).
    User,
    /// The log only the provider reads (`/jobs/{id}/provider-logs/`).
    Provider,
}

/// The routing of one output line (given without its trailing newline): where it goes and its
/// text there. A `[PUBLIC]`/`[PRIVATE]` tag (any case) is removed with the one character that
/// follows it. User functions send everything to the user log; provider functions send public
/// lines to the user log and private and untagged lines (the latter verbatim) to the provider
/// log, so a public line never reaches the provider log and nothing else reaches the user log.
pub fn route_line(line: &str, provider_function: bool) -> (Destination, &str) {
    let (tag, text) = if let Some(rest) = strip_tag(line, PUBLIC_TAG) {
        (Some(Destination::User), rest)
    } else if let Some(rest) = strip_tag(line, PRIVATE_TAG) {
        (Some(Destination::Provider), rest)
    } else {
        (None, line)
    };
    let destination = match (provider_function, tag) {
        (false, _) => Destination::User,
        (true, Some(destination)) => destination,
        (true, None) => Destination::Provider,
    };
    (destination, text)
}

/// `line` without `tag` (compared case-insensitively) and the character after it; `None` when
/// the line does not start with the tag.
fn strip_tag<'a>(line: &'a str, tag: &str) -> Option<&'a str> {
    let head = line.get(..tag.len())?;
    if !head.eq_ignore_ascii_case(tag) {
        return None;
    }
    let rest = &line[tag.len()..];
    let skipped = rest.chars().next().map_or(0, char::len_utf8);
    Some(&rest[skipped..])
}

/// The newest lines of one log within a byte budget, in constant memory: older lines are
/// dropped as newer ones arrive. The budget covers the rendered lines including their newlines,
/// so a render is at most `limit_bytes` plus the truncation notice.
#[derive(Debug, Clone)]
pub struct TailBuffer {
    limit_bytes: usize,
    lines: VecDeque<String>,
    /// Sum over `lines` of the length plus one newline.
    bytes: usize,
    truncated: bool,
}

impl TailBuffer {
    pub fn new(limit_bytes: usize) -> Self {
        Self { limit_bytes, lines: VecDeque::new(), bytes: 0, truncated: false }
    }

    /// Appends one line (without its newline), dropping the oldest lines when over budget. A
    /// line that alone exceeds the budget keeps its end, cut on a character boundary.
    pub fn push(&mut self, line: &str) {
        let cost = line.len() + 1;
        if cost > self.limit_bytes {
            self.lines.clear();
            self.bytes = 0;
            self.truncated = true;
            if self.limit_bytes > 0 {
                let tail = char_tail(line, self.limit_bytes - 1);
                self.bytes = tail.len() + 1;
                self.lines.push_back(tail.to_string());
            }
            return;
        }
        self.lines.push_back(line.to_string());
        self.bytes += cost;
        while self.bytes > self.limit_bytes {
            let dropped = self.lines.pop_front().expect("a buffer over budget holds at least one line");
            self.bytes -= dropped.len() + 1;
            self.truncated = true;
        }
    }

    /// The stored text: the lines joined by `\n` with a trailing `\n` (empty when there are no
    /// lines), after a notice when older lines were dropped.
    pub fn render(&self) -> String {
        let notice = self.truncated.then(|| {
            format!(
                "[Logs exceeded maximum allowed size ({} bytes). Logs have been truncated, \
                 discarding the oldest entries first.]\n",
                self.limit_bytes
            )
        });
        let notice = notice.unwrap_or_default();
        let mut text = String::with_capacity(notice.len() + self.bytes);
        text.push_str(&notice);
        for line in &self.lines {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// No line was ever kept (and none dropped).
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && !self.truncated
    }

    /// Some lines, or the start of an over-long line, were dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }
}

/// The longest suffix of `text` of at most `max_bytes` bytes that starts on a char boundary.
fn char_tail(text: &str, max_bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(max_bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Both logs of one job, fed line by line.
#[derive(Debug, Clone)]
pub struct LogRouter {
    pub user: TailBuffer,
    pub provider: TailBuffer,
    provider_function: bool,
    missing_client: bool,
    /// The last exception line of the user log (never of the provider's).
    exception: ExceptionSpotter,
}

/// What Python prints when the interpreter running a job lacks the client the job imports.
const MISSING_CLIENT_ERROR: &str = "No module named 'qiskit_serverless'";

/// The advice given when the jobs' interpreter cannot import `qiskit_serverless`: at start-up
/// and in the log of a job that failed on it.
pub fn missing_client_hint(python: &str) -> String {
    format!(
        "the Python that runs jobs ({python}) cannot import qiskit_serverless, so functions using \
         `from qiskit_serverless import ...` fail: start gantry with --python (GANTRY_PYTHON) naming an \
         interpreter that has qiskit-serverless installed, for example \
         `python3 -m venv venv && venv/bin/pip install qiskit-serverless` then `--python venv/bin/python`"
    )
}

impl LogRouter {
    /// Each log is capped at `limit_bytes` (`FUNCTIONS_LOGS_SIZE_LIMIT`).
    pub fn new(provider_function: bool, limit_bytes: usize) -> Self {
        Self {
            user: TailBuffer::new(limit_bytes),
            provider: TailBuffer::new(limit_bytes),
            provider_function,
            missing_client: false,
            exception: ExceptionSpotter::default(),
        }
    }

    /// The last exception line of a Python failure in the user log (see `ExceptionSpotter`);
    /// lines of the provider log never show here, so a job's reason tells its author nothing
    /// the provider keeps private.
    pub fn last_exception(&self) -> Option<&str> {
        self.exception.last()
    }

    /// Whether lines are split between the two logs (provider function) or all go to the user log.
    pub fn provider_function(&self) -> bool {
        self.provider_function
    }

    /// Whether the output showed that Python could not import `qiskit_serverless`.
    pub fn missing_client(&self) -> bool {
        self.missing_client
    }

    /// Routes one line given without its trailing newline.
    pub fn push_line(&mut self, line: &str) {
        self.missing_client |= line.contains(MISSING_CLIENT_ERROR);
        match route_line(line, self.provider_function) {
            (Destination::User, text) => {
                self.exception.see(text);
                self.user.push(text);
            }
            (Destination::Provider, text) => self.provider.push(text),
        }
    }

    /// Routes every line of `text`; a final line without newline counts as a line.
    pub fn push_text(&mut self, text: &str) {
        for line in text.lines() {
            self.push_line(line);
        }
    }
}

/// Longest exception line kept, in characters (a job's reason quotes it).
pub const EXCEPTION_LINE_CHARS: usize = 500;

/// Finds the last exception line of a Python failure in a log fed line by line: the first
/// unindented line after a `Traceback (most recent call last):` block (the exception and its
/// message, whatever its class), or, outside one (a `SyntaxError` of the main script), a line
/// `Name: message` or `Name` whose dotted name ends with `Error`, `Exception`, `Exit` or
/// `Interrupt`. Kept to `EXCEPTION_LINE_CHARS`.
#[derive(Debug, Clone, Default)]
pub struct ExceptionSpotter {
    in_traceback: bool,
    last: Option<String>,
}

impl ExceptionSpotter {
    pub fn see(&mut self, line: &str) {
        let line = line.trim_end();
        if line.trim_start().starts_with("Traceback (most recent call last):") {
            self.in_traceback = true;
            return;
        }
        if line.is_empty() || line.starts_with([' ', '\t']) {
            return;
        }
        if std::mem::take(&mut self.in_traceback) || names_an_exception(line) {
            self.last = Some(bounded(line, EXCEPTION_LINE_CHARS));
        }
    }

    pub fn last(&self) -> Option<&str> {
        self.last.as_deref()
    }
}

/// Whether `line` reads `Name: message` or `Name` with a dotted name of an exception class.
fn names_an_exception(line: &str) -> bool {
    let name = line.split_once(": ").map_or(line, |(name, _)| name);
    let dotted = !name.is_empty()
        && name.split('.').all(|part| {
            part.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_alphanumeric() || c == '_')
        });
    dotted
        && ["Error", "Exception", "Exit", "Interrupt"].iter().any(|end| name.ends_with(end) && name.len() > end.len())
}

/// `text` cut to `chars` characters, an ellipsis marking the cut.
pub fn bounded(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// `line` with every `<folder>/` of `folders` removed, so paths in it read relative to the
/// function's code folder (a traceback's `File "<data dir>/jobs/<id>/code/main.py"` reads
/// `File "main.py"`).
pub fn relative_to(line: &str, folders: &[String]) -> String {
    folders
        .iter()
        .map(|folder| folder.trim_end_matches('/'))
        .filter(|folder| !folder.is_empty())
        .fold(line.to_string(), |line, folder| line.replace(&format!("{folder}/"), ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_client_is_noticed_wherever_it_is_routed() {
        let mut router = LogRouter::new(true, 1024);
        router.push_line("[PUBLIC] fine");
        assert!(!router.missing_client());
        router.push_line("ModuleNotFoundError: No module named 'qiskit_serverless'");
        assert!(router.missing_client());
        assert!(missing_client_hint("/usr/bin/python3").contains("--python"));
    }

    #[test]
    fn tags_are_recognized_in_any_case() {
        for line in ["[PUBLIC] hi", "[public] hi", "[Public] hi", "[pUbLiC] hi"] {
            assert_eq!(route_line(line, true), (Destination::User, "hi"), "{line}");
        }
        for line in ["[PRIVATE] hi", "[private] hi", "[Private] hi"] {
            assert_eq!(route_line(line, true), (Destination::Provider, "hi"), "{line}");
        }
    }

    #[test]
    fn exactly_one_character_after_the_tag_is_removed() {
        assert_eq!(route_line("[PUBLIC]  two", true).1, " two");
        assert_eq!(route_line("[PUBLIC]x", true).1, "");
        assert_eq!(route_line("[PUBLIC]:msg", true).1, "msg");
        assert_eq!(route_line("[PUBLIC]", true), (Destination::User, ""));
        assert_eq!(route_line("[PRIVATE]éa", true).1, "a");
        assert_eq!(route_line("[PUBLIC] INFO: x", false), (Destination::User, "INFO: x"));
    }

    #[test]
    fn tags_count_only_at_the_start_of_a_line() {
        assert_eq!(route_line(" [PUBLIC] x", true), (Destination::Provider, " [PUBLIC] x"));
        assert_eq!(route_line("x [PRIVATE] y", false), (Destination::User, "x [PRIVATE] y"));
        assert_eq!(route_line("[PUBLI", true), (Destination::Provider, "[PUBLI"));
        assert_eq!(route_line("ü", true), (Destination::Provider, "ü"));
    }

    #[test]
    fn untagged_lines_go_to_the_user_log_of_user_functions_and_the_provider_log_otherwise() {
        assert_eq!(route_line("plain", false), (Destination::User, "plain"));
        assert_eq!(route_line("plain", true), (Destination::Provider, "plain"));
        assert_eq!(route_line("", true), (Destination::Provider, ""));
    }

    #[test]
    fn user_functions_keep_every_line_in_the_user_log_without_prefixes() {
        let mut router = LogRouter::new(false, 1024);
        router.push_text("[PUBLIC] a\n[PRIVATE] b\nc\n[private]d");
        assert_eq!(router.user.render(), "a\nb\nc\n\n");
        assert_eq!(router.provider.render(), "");
        assert!(router.provider.is_empty());
        assert!(!router.provider_function());
    }

    #[test]
    fn provider_functions_split_public_from_private_and_untagged_lines() {
        let mut router = LogRouter::new(true, 1024);
        router.push_text("[PUBLIC] public1\nprint output\n[PRIVATE] secret\n[public] public2\n");
        assert_eq!(router.user.render(), "public1\npublic2\n");
        assert_eq!(router.provider.render(), "print output\nsecret\n");
    }

    #[test]
    fn empty_logs_render_as_empty_text() {
        let router = LogRouter::new(true, 1024);
        assert_eq!(router.user.render(), "");
        assert_eq!(router.provider.render(), "");
        assert!(router.user.is_empty());
        assert!(!router.user.truncated());
        let mut buffer = TailBuffer::new(10);
        buffer.push("");
        assert_eq!(buffer.render(), "\n");
        assert!(!buffer.is_empty());
    }

    #[test]
    fn the_cap_keeps_the_newest_lines_and_announces_the_truncation() {
        let mut buffer = TailBuffer::new(8);
        buffer.push("one");
        buffer.push("two");
        assert_eq!(buffer.render(), "one\ntwo\n");
        assert!(!buffer.truncated());
        buffer.push("six");
        assert!(buffer.truncated());
        assert_eq!(
            buffer.render(),
            "[Logs exceeded maximum allowed size (8 bytes). Logs have been truncated, \
             discarding the oldest entries first.]\ntwo\nsix\n"
        );
        for n in 0..1000 {
            buffer.push(&format!("{n}"));
        }
        assert!(buffer.render().ends_with("\n998\n999\n"));
        assert_eq!(buffer.lines.len(), 2);
    }

    #[test]
    fn a_line_over_the_cap_keeps_its_end_on_a_character_boundary() {
        let mut buffer = TailBuffer::new(5);
        buffer.push("old");
        buffer.push("abcdefgh");
        assert!(buffer.truncated());
        assert!(buffer.render().ends_with("]\nefgh\n"));

        let mut buffer = TailBuffer::new(5);
        buffer.push("aé€");
        assert!(buffer.render().ends_with("]\n€\n"));

        let mut buffer = TailBuffer::new(0);
        buffer.push("x");
        assert!(buffer.truncated());
        assert!(buffer.render().ends_with("first.]\n"));
    }

    #[test]
    fn a_line_exactly_at_the_cap_is_kept_whole() {
        let mut buffer = TailBuffer::new(5);
        buffer.push("abcd");
        assert_eq!(buffer.render(), "abcd\n");
        assert!(!buffer.truncated());
    }

    #[test]
    fn the_last_exception_line_of_a_traceback_is_found() {
        let mut spotter = ExceptionSpotter::default();
        for line in [
            "INFO: starting",
            "Traceback (most recent call last):",
            "  File \"main.py\", line 3, in <module>",
            "    print(1 / 0)",
            "          ~~^~~",
            "ZeroDivisionError: division by zero",
            "Note: not an exception",
        ] {
            spotter.see(line);
        }
        assert_eq!(spotter.last(), Some("ZeroDivisionError: division by zero"));
        // A class of any name ends a traceback; a syntax error of the main script has none.
        spotter.see("Traceback (most recent call last):");
        spotter.see("  File \"main.py\", line 1, in <module>");
        spotter.see("__main__.Boom: it broke");
        assert_eq!(spotter.last(), Some("__main__.Boom: it broke"));
        spotter.see("SyntaxError: '(' was never closed");
        assert_eq!(spotter.last(), Some("SyntaxError: '(' was never closed"));
        spotter.see("KeyboardInterrupt");
        assert_eq!(spotter.last(), Some("KeyboardInterrupt"));
        for line in ["Error: not a class", "x.py:3: UserWarning: w", "ERROR:root:boom", "my value: 3"] {
            spotter.see(line);
        }
        assert_eq!(spotter.last(), Some("KeyboardInterrupt"));
        spotter.see(&format!("ValueError: {}", "x".repeat(2000)));
        assert_eq!(spotter.last().unwrap().chars().count(), EXCEPTION_LINE_CHARS + 1);
    }

    #[test]
    fn a_provider_functions_private_exception_is_not_the_users() {
        let mut router = LogRouter::new(true, 1024);
        router.push_line("ValueError: provider secret");
        assert_eq!(router.last_exception(), None);
        router.push_line("[PUBLIC] RuntimeError: public failure");
        assert_eq!(router.last_exception(), Some("RuntimeError: public failure"));
    }

    #[test]
    fn paths_are_made_relative_to_the_code_folder() {
        let folders = ["/data/jobs/j1/code".to_string(), "/real/jobs/j1/code/".to_string()];
        assert_eq!(
            relative_to("  File \"/data/jobs/j1/code/main.py\", line 3, in <module>", &folders),
            "  File \"main.py\", line 3, in <module>"
        );
        assert_eq!(relative_to("/real/jobs/j1/code/lib/x.py", &folders), "lib/x.py");
        assert_eq!(relative_to("/data/jobs/j1/codex/y.py", &folders), "/data/jobs/j1/codex/y.py");
        assert_eq!(relative_to("/a/b.py", &["/".to_string()]), "/a/b.py", "never every slash");
    }
}
