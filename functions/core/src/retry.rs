//! Retry policies: the named presets of DESIGN.md and bounded custom schedules.
//!
//! A policy is a list of delays between attempts, a jitter fraction and whether
//! client-side failures (3xx, 4xx) retry. Attempts = 1 + number of delays. Jitter
//! spreads retries of a burst of failures so a recovering receiver is not hit by all
//! of them in the same second.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::outcome::FailureKind;

/// Most delays a custom schedule may list (more would keep a failing delivery alive
/// for weeks and hide the problem from the humans who should see it).
pub const MAX_CUSTOM_DELAYS: usize = 20;
/// Shortest delay a custom schedule may ask for.
pub const MIN_DELAY: Duration = Duration::from_secs(1);
/// Longest single delay, and the cap on an honoured `Retry-After`.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);
/// Largest jitter fraction (±50 %).
pub const MAX_JITTER: f64 = 0.5;

const STANDARD_DELAYS_S: [u64; 8] = [30, 60, 120, 300, 900, 3600, 6 * 3600, 24 * 3600];
const STANDARD_JITTER: f64 = 0.2;
const PERSISTENT_DELAYS_S: [u64; 5] = [5, 30, 300, 3600, 24 * 3600];
const PERSISTENT_JITTER: f64 = 0.1;

/// The named presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryPreset {
    /// 30s 1m 2m 5m 15m 1h 6h 24h, ±20 %, 4xx not retried except 408 and 429.
    Standard,
    /// 5s 30s 5m 1h 24h, ±10 %, every failure retried.
    Persistent,
    /// One attempt, never retried.
    None,
}

/// A custom schedule as an API client writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomRetry {
    pub delays_s: Vec<u64>,
    #[serde(default)]
    pub jitter: f64,
    #[serde(default)]
    pub retry_4xx: bool,
}

/// What an endpoint asks for: a preset name or a custom schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RetrySpec {
    Preset(RetryPreset),
    Custom(CustomRetry),
}

/// What a retry spec may be, for error messages.
const RETRY_SPEC_FORMS: &str = r#""standard", "persistent", "none", or a custom schedule {"delays_s": [seconds, …], "jitter": 0 to 0.5, "retry_4xx": true|false}"#;

/// By hand rather than `untagged`, so a wrong value says what is allowed instead of
/// "did not match any variant".
impl<'de> Deserialize<'de> for RetrySpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(name) => match name.as_str() {
                "standard" => Ok(Self::Preset(RetryPreset::Standard)),
                "persistent" => Ok(Self::Preset(RetryPreset::Persistent)),
                "none" => Ok(Self::Preset(RetryPreset::None)),
                other => Err(D::Error::custom(format!(
                    "unknown preset `{other}`; expected {RETRY_SPEC_FORMS}"
                ))),
            },
            object @ serde_json::Value::Object(_) => serde_json::from_value(object)
                .map(Self::Custom)
                .map_err(|e| {
                    D::Error::custom(format!("{e}; a custom schedule is {RETRY_SPEC_FORMS}"))
                }),
            other => Err(D::Error::custom(format!(
                "got {other}; expected {RETRY_SPEC_FORMS}"
            ))),
        }
    }
}

impl Default for RetrySpec {
    fn default() -> Self {
        Self::Preset(RetryPreset::Standard)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetryError {
    #[error("a custom schedule lists at most {MAX_CUSTOM_DELAYS} delays")]
    TooManyDelays,
    #[error("each delay must be between 1 and 86400 seconds")]
    DelayOutOfRange,
    #[error("jitter must be between 0 and 0.5")]
    JitterOutOfRange,
}

impl RetrySpec {
    /// The validated policy this spec describes.
    pub fn policy(&self) -> Result<RetryPolicy, RetryError> {
        match self {
            Self::Preset(RetryPreset::Standard) => Ok(RetryPolicy::from_secs(
                &STANDARD_DELAYS_S,
                STANDARD_JITTER,
                false,
            )),
            Self::Preset(RetryPreset::Persistent) => Ok(RetryPolicy::from_secs(
                &PERSISTENT_DELAYS_S,
                PERSISTENT_JITTER,
                true,
            )),
            Self::Preset(RetryPreset::None) => Ok(RetryPolicy::from_secs(&[], 0.0, false)),
            Self::Custom(c) => {
                if c.delays_s.len() > MAX_CUSTOM_DELAYS {
                    return Err(RetryError::TooManyDelays);
                }
                let in_range = |s: &u64| (MIN_DELAY.as_secs()..=MAX_DELAY.as_secs()).contains(s);
                if !c.delays_s.iter().all(in_range) {
                    return Err(RetryError::DelayOutOfRange);
                }
                if !(0.0..=MAX_JITTER).contains(&c.jitter) {
                    return Err(RetryError::JitterOutOfRange);
                }
                Ok(RetryPolicy::from_secs(&c.delays_s, c.jitter, c.retry_4xx))
            }
        }
    }
}

/// A validated retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    delays: Vec<Duration>,
    jitter: f64,
    retry_4xx: bool,
}

impl RetryPolicy {
    fn from_secs(delays_s: &[u64], jitter: f64, retry_4xx: bool) -> Self {
        Self {
            delays: delays_s.iter().map(|s| Duration::from_secs(*s)).collect(),
            jitter,
            retry_4xx,
        }
    }

    /// 1 + the number of delays.
    pub fn max_attempts(&self) -> u32 {
        1 + self.delays.len() as u32
    }

    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// Whether a failure of this kind (with this status, for HTTP answers) is worth
    /// another attempt under this policy.
    pub fn is_retryable(&self, kind: FailureKind, status: Option<u16>) -> bool {
        match kind {
            // A refused target is the operator's configuration; retrying cannot help.
            FailureKind::TargetRefused => false,
            // 408 and 429 are the receiver asking us to come back later.
            FailureKind::ClientError if matches!(status, Some(408) | Some(429)) => true,
            FailureKind::ClientError | FailureKind::Redirect => self.retry_4xx,
            _ => true,
        }
    }

    /// How long to wait after failed attempt number `attempt` (1-based), or `None` when
    /// the schedule is exhausted. Within ±jitter of the scheduled delay; never earlier
    /// than `retry_after` (itself capped at [`MAX_DELAY`]).
    pub fn next_delay<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        rng: &mut R,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        let index = usize::try_from(attempt.checked_sub(1)?).ok()?;
        let base = self.delays.get(index)?.as_secs_f64();
        let factor = 1.0 + rng.gen_range(-self.jitter..=self.jitter);
        let jittered = Duration::from_secs_f64(base * factor);
        let asked = retry_after.map(|ra| ra.min(MAX_DELAY)).unwrap_or_default();
        Some(jittered.max(asked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn preset(p: RetryPreset) -> RetryPolicy {
        RetrySpec::Preset(p).policy().unwrap()
    }

    #[test]
    fn presets_match_the_design() {
        let std = preset(RetryPreset::Standard);
        assert_eq!(std.max_attempts(), 9);
        let total: u64 = std.delays().iter().map(Duration::as_secs).sum();
        assert_eq!(total, 30 + 60 + 120 + 300 + 900 + 3600 + 21600 + 86400); // ≈ 31 h
        assert_eq!(preset(RetryPreset::Persistent).max_attempts(), 6);
        assert_eq!(preset(RetryPreset::None).max_attempts(), 1);
    }

    #[test]
    fn four_xx_rules() {
        let std = preset(RetryPreset::Standard);
        let per = preset(RetryPreset::Persistent);
        let c4 = FailureKind::ClientError;
        assert!(!std.is_retryable(c4, Some(400)));
        assert!(!std.is_retryable(c4, Some(404)));
        assert!(std.is_retryable(c4, Some(408)));
        assert!(std.is_retryable(c4, Some(429)));
        assert!(!std.is_retryable(FailureKind::Redirect, Some(302)));
        assert!(per.is_retryable(c4, Some(400)));
        assert!(per.is_retryable(FailureKind::Redirect, Some(302)));
        for kind in [
            FailureKind::Timeout,
            FailureKind::ConnectionRefused,
            FailureKind::Dns,
            FailureKind::Tls,
            FailureKind::ServerError,
        ] {
            assert!(std.is_retryable(kind, None), "{kind:?}");
        }
        assert!(!per.is_retryable(FailureKind::TargetRefused, None));
    }

    #[test]
    fn custom_schedules_are_bounded() {
        let custom = |delays_s: Vec<u64>, jitter| {
            RetrySpec::Custom(CustomRetry {
                delays_s,
                jitter,
                retry_4xx: false,
            })
            .policy()
        };
        assert_eq!(custom(vec![1; 21], 0.0), Err(RetryError::TooManyDelays));
        assert_eq!(custom(vec![0], 0.0), Err(RetryError::DelayOutOfRange));
        assert_eq!(custom(vec![86401], 0.0), Err(RetryError::DelayOutOfRange));
        assert_eq!(custom(vec![1], 0.6), Err(RetryError::JitterOutOfRange));
        assert_eq!(custom(vec![1], -0.1), Err(RetryError::JitterOutOfRange));
        assert_eq!(custom(vec![1; 20], 0.5).unwrap().max_attempts(), 21);
    }

    #[test]
    fn specs_parse_from_api_json() {
        let p: RetrySpec = serde_json::from_str("\"persistent\"").unwrap();
        assert_eq!(p, RetrySpec::Preset(RetryPreset::Persistent));
        let c: RetrySpec = serde_json::from_str(r#"{"delays_s":[1,2],"jitter":0.1}"#).unwrap();
        assert_eq!(c.policy().unwrap().max_attempts(), 3);
        assert!(serde_json::from_str::<RetrySpec>("\"sometimes\"").is_err());
        assert!(serde_json::from_str::<RetrySpec>(r#"{"delays":[1]}"#).is_err());
    }

    fn all_policies() -> impl Strategy<Value = RetryPolicy> {
        let presets = prop_oneof![
            Just(RetryPreset::Standard),
            Just(RetryPreset::Persistent),
            Just(RetryPreset::None)
        ]
        .prop_map(preset);
        let custom = (
            proptest::collection::vec(1u64..=86_400, 0..=MAX_CUSTOM_DELAYS),
            0.0f64..=MAX_JITTER,
            any::<bool>(),
        )
            .prop_map(|(delays_s, jitter, retry_4xx)| {
                RetrySpec::Custom(CustomRetry {
                    delays_s,
                    jitter,
                    retry_4xx,
                })
                .policy()
                .unwrap()
            });
        prop_oneof![presets, custom]
    }

    proptest! {
        #[test]
        fn jitter_stays_within_bounds(policy in all_policies(), seed in any::<u64>()) {
            let mut rng = StdRng::seed_from_u64(seed);
            for (i, base) in policy.delays().iter().enumerate() {
                let d = policy.next_delay(i as u32 + 1, &mut rng, None).unwrap().as_secs_f64();
                let b = base.as_secs_f64();
                let slack = 1e-6;
                prop_assert!(d >= b * (1.0 - policy.jitter()) - slack, "{d} < {b}");
                prop_assert!(d <= b * (1.0 + policy.jitter()) + slack, "{d} > {b}");
            }
        }

        #[test]
        fn retry_after_is_never_undercut_and_is_capped(
            policy in all_policies(),
            seed in any::<u64>(),
            retry_after_s in 0u64..10 * 86_400,
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let ra = Duration::from_secs(retry_after_s);
            for attempt in 1..policy.max_attempts() {
                let d = policy.next_delay(attempt, &mut rng, Some(ra)).unwrap();
                prop_assert!(d >= ra.min(MAX_DELAY));
                let jittered_max = policy.delays()[attempt as usize - 1]
                    .mul_f64(1.0 + policy.jitter());
                prop_assert!(d <= MAX_DELAY.max(jittered_max) + Duration::from_millis(1));
            }
        }

        #[test]
        fn exhausted_after_exactly_one_plus_delays(policy in all_policies(), seed in any::<u64>()) {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut attempts = 1;
            while policy.next_delay(attempts, &mut rng, None).is_some() {
                attempts += 1;
            }
            prop_assert_eq!(attempts, policy.max_attempts());
            prop_assert_eq!(policy.next_delay(0, &mut rng, None), None);
        }
    }
}
