//! Parsing the `Retry-After` response header (RFC 9110 §10.2.3).
//!
//! A receiver that says when to come back is obeyed: the header is either
//! delta-seconds or an HTTP-date (IMF-fixdate). A value we cannot read is ignored,
//! never fatal: a broken header must not turn a retryable failure into a lost event.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The wait a `Retry-After` value asks for, relative to `now`. A date in the past
/// asks for no wait; garbage gives `None`.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Saturate rather than fail on absurd numbers; the policy caps the wait anyway.
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    if !value.ends_with(" GMT") {
        return None;
    }
    let at = DateTime::parse_from_rfc2822(value)
        .ok()?
        .with_timezone(&Utc);
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(parse_retry_after("3", now()), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after(" 120 ", now()),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("99999999999999999999999", now()),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn http_dates_relative_to_now() {
        assert_eq!(
            parse_retry_after("Mon, 30 Nov 2026 12:01:30 GMT", now()),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now()),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn garbage_is_ignored() {
        for bad in [
            "",
            "soon",
            "-5",
            "1.5",
            "Mon, 30 Nov 2026 12:01:30 +0200",
            "Mon, 99 Foo",
        ] {
            assert_eq!(parse_retry_after(bad, now()), None, "{bad:?}");
        }
    }
}
