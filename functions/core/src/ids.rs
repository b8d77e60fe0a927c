//! Typed, prefixed identifiers (`ten_`, `ep_`, `evt_`, `dlv_`, `att_`, `fail_`).
//!
//! Every id is a prefix plus a UUIDv7 in lowercase hex without dashes, so ids sort by
//! creation time and a string of the wrong kind is rejected at the boundary instead of
//! travelling through the system. Event ids are special: producers may bring their own
//! (a UUID, say), so [`EventId`] accepts any non-empty token that can be signed safely.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Longest event id a producer may bring; keeps keys and headers small.
pub const MAX_EVENT_ID_LEN: usize = 128;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("expected an id starting with `{expected}`")]
    WrongPrefix { expected: &'static str },
    #[error("the part after `{prefix}` must be 32 lowercase hex digits")]
    BadBody { prefix: &'static str },
    #[error("an event id must be 1 to {MAX_EVENT_ID_LEN} characters of letters, digits, `_`, `-` or `:` (no `.`)")]
    BadEventId,
}

/// Render a UUID the way every id carries it: 32 lowercase hex digits.
fn uuid_body(uuid: Uuid) -> String {
    uuid.simple().to_string()
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The prefix every id of this kind starts with.
            pub const PREFIX: &'static str = $prefix;

            /// A new, time-ordered id.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, uuid_body(Uuid::now_v7())))
            }

            /// Wrap a UUID (used where an id must be derived deterministically).
            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(format!("{}{}", $prefix, uuid_body(uuid)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                let body = s
                    .strip_prefix($prefix)
                    .ok_or(IdError::WrongPrefix { expected: $prefix })?;
                let valid = body.len() == 32
                    && body.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                if !valid {
                    return Err(IdError::BadBody { prefix: $prefix });
                }
                Ok(Self(s.to_owned()))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

prefixed_id!(
    /// A tenant: one customer of Entrega, owner of endpoints and events.
    TenantId, "ten_"
);
prefixed_id!(
    /// An endpoint: one URL a tenant's customer receives webhooks at.
    EndpointId, "ep_"
);
prefixed_id!(
    /// One event sent to one endpoint.
    DeliveryId, "dlv_"
);
prefixed_id!(
    /// One HTTP attempt of a delivery.
    AttemptId, "att_"
);
prefixed_id!(
    /// A dead-letter record: a delivery that could not be made.
    FailureId, "fail_"
);
prefixed_id!(
    /// An API key's public identifier (the secret part is never stored).
    ApiKeyId, "key_"
);

/// A UUIDv7 whose time is `unix_ms` and whose random bits are a hash of `parts`:
/// the same inputs always give the same id, and ids still sort by time.
fn derived_v7(unix_ms: i64, parts: &[&str]) -> Uuid {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    let ms = unix_ms.max(0) as u64;
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6..].copy_from_slice(&digest[..10]);
    bytes[6] = 0x70 | (bytes[6] & 0x0f); // version 7
    bytes[8] = 0x80 | (bytes[8] & 0x3f); // RFC 4122 variant
    Uuid::from_bytes(bytes)
}

impl DeliveryId {
    /// The one delivery of `event` to `endpoint`. Deriving it (instead of generating
    /// it) is what makes fan-out idempotent: a replayed outbox record computes the same
    /// id, and the store's create-if-absent refuses the duplicate.
    ///
    /// Every delivery of one event starts alike ([`Self::prefix_of_event`]): the
    /// event's creation time, then 18 bits of a hash of the event id in the first
    /// random bits UUIDv7 has (its 12 `rand_a` bits and the 6 after the variant); the
    /// last 56 bits tell its endpoints apart. A store finds an event's deliveries among
    /// the ids sharing that start: a handful, even when a producer stamps a backfill
    /// of millions of events with one second (10 million in one: about 40 a group).
    pub fn for_event(event: &EventId, endpoint: &EndpointId, event_created_ms: i64) -> Self {
        let mut bytes =
            *derived_v7(event_created_ms, &[event.as_str(), endpoint.as_str()]).as_bytes();
        bytes[6..9].copy_from_slice(&event_group(event));
        Self::from_uuid(Uuid::from_bytes(bytes))
    }

    /// The start every delivery id of `event` shares (see [`Self::for_event`]): its
    /// bytes 0 to 8 as hex.
    pub fn prefix_of_event(event: &EventId, event_created_ms: i64) -> String {
        let [b6, b7, b8] = event_group(event);
        format!(
            "{}{:012x}{b6:02x}{b7:02x}{b8:02x}",
            Self::PREFIX,
            event_created_ms.max(0)
        )
    }
}

/// Bytes 6 to 8 of every delivery id of `event`: the version and variant bits UUIDv7
/// fixes, around 18 bits of a hash of the event id.
fn event_group(event: &EventId) -> [u8; 3] {
    let digest = Sha256::digest(event.as_str().as_bytes());
    [
        0x70 | (digest[0] & 0x0f), // version 7
        digest[1],
        0x80 | (digest[2] & 0x3f), // RFC 4122 variant
    ]
}

impl DeliveryId {
    /// The creation time in the id (unix ms): ids of a day share a log partition.
    pub fn timestamp_ms(&self) -> i64 {
        i64::from_str_radix(&self.0[Self::PREFIX.len()..Self::PREFIX.len() + 12], 16)
            .expect("a validated id has 12 hex digits of time")
    }
}

impl AttemptId {
    /// The record of attempt `number` of a delivery's `generation` whose outcome was
    /// never learned (the process died while it ran). Derived, so two workers that
    /// find the same interrupted attempt write one record, not two.
    pub fn interrupted(delivery: &DeliveryId, generation: u32, number: u32, began_ms: i64) -> Self {
        Self::from_uuid(derived_v7(
            began_ms,
            &[
                delivery.as_str(),
                &generation.to_string(),
                &number.to_string(),
            ],
        ))
    }
}

impl FailureId {
    /// The failure record of one delivery's `generation` (each resend is a new
    /// generation): a redelivered failure message finds the record it already wrote.
    pub fn for_delivery(delivery: &DeliveryId, generation: u32, failed_ms: i64) -> Self {
        Self::from_uuid(derived_v7(
            failed_ms,
            &[delivery.as_str(), &generation.to_string()],
        ))
    }
}

/// An event id: `evt_…` when Entrega makes it, or the producer's own token (a UUID).
/// It never contains `.`, because signatures cover `"{id}.{timestamp}.{body}"`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    pub const PREFIX: &'static str = "evt_";

    pub fn generate() -> Self {
        Self(format!("{}{}", Self::PREFIX, uuid_body(Uuid::now_v7())))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for EventId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let valid = !s.is_empty()
            && s.len() <= MAX_EVENT_ID_LEN
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':'));
        if valid {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdError::BadEventId)
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_round_trip_and_sort_by_time() {
        let a = DeliveryId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = DeliveryId::generate();
        assert!(a < b);
        assert_eq!(a.as_str().parse::<DeliveryId>().unwrap(), a);
        assert!(a.as_str().starts_with("dlv_"));
        assert_eq!(a.as_str().len(), 4 + 32);
    }

    #[test]
    fn wrong_kind_or_garbage_is_an_error_not_a_panic() {
        let ep = EndpointId::generate();
        assert_eq!(
            ep.as_str().parse::<TenantId>(),
            Err(IdError::WrongPrefix { expected: "ten_" })
        );
        assert_eq!(
            "ep_xyz".parse::<EndpointId>(),
            Err(IdError::BadBody { prefix: "ep_" })
        );
        assert!("ep_0123456789ABCDEF0123456789abcdef"
            .parse::<EndpointId>()
            .is_err());
        assert!(serde_json::from_str::<TenantId>("\"fail_x\"").is_err());
    }

    #[test]
    fn event_ids_accept_producer_uuids_but_never_a_dot() {
        assert!("0b4e6f8a-1f3c-4c1e-9d7e-6a2b5c3d4e5f"
            .parse::<EventId>()
            .is_ok());
        assert!("msg_p5jXN8AQM9LWM0D4loKWxJek".parse::<EventId>().is_ok());
        assert_eq!("a.b".parse::<EventId>(), Err(IdError::BadEventId));
        assert_eq!("".parse::<EventId>(), Err(IdError::BadEventId));
        assert!("x".repeat(MAX_EVENT_ID_LEN + 1).parse::<EventId>().is_err());
        assert!(!EventId::generate().as_str().contains('.'));
    }

    #[test]
    fn delivery_ids_are_derived_deterministically() {
        let evt = EventId::generate();
        let (e1, e2) = (EndpointId::generate(), EndpointId::generate());
        let a = DeliveryId::for_event(&evt, &e1, 1_700_000_000_000);
        assert_eq!(a, DeliveryId::for_event(&evt, &e1, 1_700_000_000_000));
        assert_ne!(a, DeliveryId::for_event(&evt, &e2, 1_700_000_000_000));
        assert!(a < DeliveryId::for_event(&evt, &e1, 1_700_000_000_001));
        assert_eq!(a.timestamp_ms(), 1_700_000_000_000);
        let parsed = Uuid::parse_str(&a.as_str()[4..]).unwrap();
        assert_eq!(parsed.get_version_num(), 7);
        assert_eq!(a.as_str().parse::<DeliveryId>().unwrap(), a);
        let b = DeliveryId::for_event(&evt, &e2, 1_700_000_000_000);
        let prefix = DeliveryId::prefix_of_event(&evt, 1_700_000_000_000);
        assert!(a.as_str().starts_with(&prefix) && b.as_str().starts_with(&prefix));
        // Other events of the same millisecond start otherwise (18 bits: a clash in
        // 10 000 is about a 4 % chance, two about 0.1 %).
        let others = (0..10_000)
            .map(|_| DeliveryId::for_event(&EventId::generate(), &e1, 1_700_000_000_000))
            .filter(|d| d.as_str().starts_with(&prefix))
            .count();
        assert!(others <= 2, "{others} of 10 000 share the prefix");
    }
}
