//! Small pieces every layer may use: the duration syntax of the timeout flags, and the shutdown
//! signal the long-running roles stop on. Nothing here imports another module of the crate.

/// `PROGRAM_TIMEOUT`: a number of hours, or a number with `s`, `m` or `h`.
pub fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit_seconds) = match text.char_indices().last() {
        Some((index, 's')) => (&text[..index], 1.0),
        Some((index, 'm')) => (&text[..index], 60.0),
        Some((index, 'h')) => (&text[..index], 3600.0),
        _ => (text, 3600.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid timeout '{text}': use hours (24) or a number with s, m or h"))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("invalid timeout '{text}': it must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(value * unit_seconds))
}

/// SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_hours_or_carry_a_unit() {
        use std::time::Duration;
        assert_eq!(parse_timeout("24").unwrap(), Duration::from_secs(24 * 3600));
        assert_eq!(parse_timeout("0.5").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_timeout("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_timeout("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_timeout("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_timeout("soon").is_err());
        assert!(parse_timeout("0").is_err());
    }
}
