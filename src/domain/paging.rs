//! Keyset pagination of the job listings (`?cursor=` beside `offset`). The listings are ordered
//! newest first by (creation time, id); a cursor names one job's place in that order and which
//! side of it the page lies on, so a page is read from the index at that place instead of after
//! skipping `offset` rows, and costs the same on page 1 and page 100,000. A cursor is opaque to
//! clients (base64url text); the links of a keyset page carry the next and previous ones.
//!
//! Offset pagination stays what the reference client uses and answers exactly as before.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Which side of the cursor's job a page lies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The jobs after it in the listing's order (created earlier): the next page.
    Older,
    /// The jobs before it (created later): the previous page.
    Newer,
}

/// A place in a newest-first listing: the jobs strictly older (or newer) than (created, id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub direction: Direction,
    /// The creation time of the job it names (microseconds since the Unix epoch).
    pub created: i64,
    pub id: String,
}

/// The longest id a cursor may carry (job ids are 36-character UUIDs).
const MAX_ID_LENGTH: usize = 64;

/// The message of a cursor that is not one this gateway gave.
pub const INVALID_CURSOR: &str = "'cursor' is not a valid cursor: use the one in a listing's next or previous link, or an empty cursor for the first page.";

impl Cursor {
    /// The opaque text of the cursor: base64url of `o:<created>:<id>` (or `n:` for newer).
    pub fn encode(&self) -> String {
        let side = match self.direction {
            Direction::Older => 'o',
            Direction::Newer => 'n',
        };
        URL_SAFE_NO_PAD.encode(format!("{side}:{}:{}", self.created, self.id))
    }

    /// Reads a cursor's text; `Err` for anything `encode` cannot have made.
    pub fn decode(text: &str) -> Result<Cursor, &'static str> {
        let bytes = URL_SAFE_NO_PAD.decode(text.trim().as_bytes()).map_err(|_| INVALID_CURSOR)?;
        let text = String::from_utf8(bytes).map_err(|_| INVALID_CURSOR)?;
        let mut parts = text.splitn(3, ':');
        let direction = match parts.next() {
            Some("o") => Direction::Older,
            Some("n") => Direction::Newer,
            _ => return Err(INVALID_CURSOR),
        };
        let created = parts.next().and_then(|n| n.parse::<i64>().ok()).ok_or(INVALID_CURSOR)?;
        let id = parts.next().filter(|id| valid_id(id)).ok_or(INVALID_CURSOR)?;
        Ok(Cursor { direction, created, id: id.to_string() })
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LENGTH && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The cursors of a keyset page's links, from what the page query returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Links {
    pub next: Option<Cursor>,
    pub previous: Option<Cursor>,
}

/// Given the page's jobs as (created, id) in the listing's order (newest first), whether more
/// jobs lie beyond the page on the side it was read towards (the query asks for one job more
/// than the page holds), and the cursor it was read from (`None`: the first page), the cursors
/// of its next and previous links. A page read towards older jobs has a previous page when it
/// was read from a cursor; one read towards newer jobs always has a next page (the page it was
/// reached from). An empty page read from a cursor links back to where it was read from.
pub fn links(page: &[(i64, &str)], more: bool, from: Option<&Cursor>) -> Links {
    let at = |(created, id): (i64, &str), direction| Cursor { direction, created, id: id.to_string() };
    let (first, last) = (page.first().copied(), page.last().copied());
    let towards_older = from.is_none_or(|cursor| cursor.direction == Direction::Older);
    let (older_beyond, newer_beyond) = match towards_older {
        true => (more, from.is_some()),
        false => (true, more),
    };
    let next = match (older_beyond, last) {
        (true, Some(last)) => Some(at(last, Direction::Older)),
        (true, None) => from.map(|cursor| Cursor { direction: Direction::Older, ..cursor.clone() }),
        (false, _) => None,
    };
    let previous = match (newer_beyond, first) {
        (true, Some(first)) => Some(at(first, Direction::Newer)),
        (true, None) => from.map(|cursor| Cursor { direction: Direction::Newer, ..cursor.clone() }),
        (false, _) => None,
    };
    Links { next, previous }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(direction: Direction, created: i64, id: &str) -> Cursor {
        Cursor { direction, created, id: id.to_string() }
    }

    #[test]
    fn a_cursor_reads_back_as_it_was_written() {
        for c in [
            cursor(Direction::Older, 1_735_689_600_000_000, "be0c0000-0000-0000-0000-00000000c350"),
            cursor(Direction::Newer, -5, "a"),
            cursor(Direction::Older, i64::MAX, "0"),
        ] {
            let text = c.encode();
            assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{text}");
            assert_eq!(Cursor::decode(&text), Ok(c));
        }
    }

    #[test]
    fn anything_else_is_refused() {
        let encoded = |text: &str| URL_SAFE_NO_PAD.encode(text);
        for bad in [
            "".to_string(),
            "not base64!".to_string(),
            "%%%".to_string(),
            encoded("x:1:abc"),
            encoded("o:1"),
            encoded("o::abc"),
            encoded("o:1.5:abc"),
            encoded("o:1:"),
            encoded("o:1:a b"),
            encoded("o:1:a'--"),
            encoded(&format!("o:1:{}", "a".repeat(65))),
            encoded("o:99999999999999999999:abc"),
            URL_SAFE_NO_PAD.encode([b'o', b':', b'1', b':', 0xff]),
        ] {
            assert_eq!(Cursor::decode(&bad), Err(INVALID_CURSOR), "{bad}");
        }
    }

    #[test]
    fn the_first_page_links_only_onwards_and_only_when_more_follow() {
        let page = [(30, "c"), (20, "b")];
        assert_eq!(links(&page, true, None), Links { next: Some(cursor(Direction::Older, 20, "b")), previous: None });
        assert_eq!(links(&page, false, None), Links { next: None, previous: None });
        assert_eq!(links(&[], false, None), Links { next: None, previous: None });
    }

    #[test]
    fn a_page_read_onwards_links_back_to_its_first_job() {
        let from = cursor(Direction::Older, 40, "d");
        let page = [(30, "c"), (20, "b")];
        assert_eq!(
            links(&page, true, Some(&from)),
            Links { next: Some(cursor(Direction::Older, 20, "b")), previous: Some(cursor(Direction::Newer, 30, "c")) }
        );
        assert_eq!(
            links(&page, false, Some(&from)),
            Links { next: None, previous: Some(cursor(Direction::Newer, 30, "c")) }
        );
        // Past the end: back to where it was read from.
        assert_eq!(
            links(&[], false, Some(&from)),
            Links { next: None, previous: Some(cursor(Direction::Newer, 40, "d")) }
        );
    }

    #[test]
    fn a_page_read_backwards_links_onwards_and_back_while_newer_jobs_remain() {
        let from = cursor(Direction::Newer, 10, "a");
        let page = [(30, "c"), (20, "b")];
        assert_eq!(
            links(&page, true, Some(&from)),
            Links { next: Some(cursor(Direction::Older, 20, "b")), previous: Some(cursor(Direction::Newer, 30, "c")) }
        );
        assert_eq!(
            links(&page, false, Some(&from)),
            Links { next: Some(cursor(Direction::Older, 20, "b")), previous: None }
        );
        assert_eq!(
            links(&[], false, Some(&from)),
            Links { next: Some(cursor(Direction::Older, 10, "a")), previous: None }
        );
    }
}
