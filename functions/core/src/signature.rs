//! Standard Webhooks 1.0 signatures: the endpoint secret, signing, and verification.
//!
//! The signed content is `"{webhook-id}.{webhook-timestamp}.{body}"`, the MAC is
//! HMAC-SHA256 keyed with the secret's decoded bytes, and the header carries
//! `v1,<base64>` once per active secret (during rotation the old secret keeps signing
//! beside the new one, so receivers can switch at their own pace).

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Every secret starts with this, so a leaked one is recognisable by scanners.
pub const SECRET_PREFIX: &str = "whsec_";
/// Shortest secret key we accept, in bytes (192 bits).
pub const MIN_SECRET_BYTES: usize = 24;
/// Longest secret key we accept, in bytes.
pub const MAX_SECRET_BYTES: usize = 64;
/// Length of the secrets Entrega generates.
pub const GENERATED_SECRET_BYTES: usize = 32;
/// How far a receiver's clock may be from the signed timestamp (the spec's default).
pub const DEFAULT_TOLERANCE_SECS: i64 = 5 * 60;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a secret must start with `whsec_`")]
    MissingPrefix,
    #[error("the part after `whsec_` must be base64")]
    NotBase64,
    #[error("a secret must decode to 24 to 64 bytes")]
    BadLength,
}

/// An endpoint signing secret. Its `Debug` and `Display` never show the key, so a
/// secret that slips into a log line or an error message leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Self {
        let mut key = vec![0u8; GENERATED_SECRET_BYTES];
        rand::thread_rng().fill_bytes(&mut key);
        Self { key }
    }

    /// The full `whsec_…` form, for showing to the endpoint's owner and for storage.
    pub fn expose(&self) -> String {
        format!("{SECRET_PREFIX}{}", BASE64.encode(&self.key))
    }

    /// `v1,<base64 mac>` over `"{id}.{timestamp}.{body}"`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", BASE64.encode(self.mac(id, timestamp, body)))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().to_vec()
    }
}

impl FromStr for Secret {
    type Err = SecretError;
    fn from_str(s: &str) -> Result<Self, SecretError> {
        let encoded = s
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let key = BASE64.decode(encoded).map_err(|_| SecretError::NotBase64)?;
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&key.len()) {
            return Err(SecretError::BadLength);
        }
        Ok(Self { key })
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(whsec_***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("whsec_***")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.expose())
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The `webhook-signature` header value: one `v1,…` per secret, space-separated.
pub fn signature_header<'a>(
    secrets: impl IntoIterator<Item = &'a Secret>,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .into_iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a received webhook does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the timestamp is too far from now")]
    TimestampOutOfTolerance,
    #[error("no signature matches")]
    NoMatchingSignature,
}

/// Verify a received webhook as a receiver would: the timestamp within `tolerance_secs`
/// of `now`, and any `v1` signature in `header` made by any of `secrets`. The MAC
/// comparison is constant-time.
pub fn verify(
    secrets: &[Secret],
    id: &str,
    timestamp: i64,
    body: &[u8],
    header: &str,
    now: i64,
    tolerance_secs: i64,
) -> Result<(), VerifyError> {
    if (now - timestamp).abs() > tolerance_secs {
        return Err(VerifyError::TimestampOutOfTolerance);
    }
    let offered: Vec<Vec<u8>> = header
        .split(' ')
        .filter_map(|sig| sig.strip_prefix("v1,"))
        .filter_map(|b64| BASE64.decode(b64).ok())
        .collect();
    for secret in secrets {
        let expected = secret.mac(id, timestamp, body);
        if offered
            .iter()
            .any(|candidate| bool::from(candidate.ct_eq(&expected)))
        {
            return Ok(());
        }
    }
    Err(VerifyError::NoMatchingSignature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VECTORS: [(&str, &str, i64, &str, &str); 2] = [
        (
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
        (
            "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            r#"{"email":"test@example.com","username":"test_user"}"#,
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
        ),
    ];

    #[test]
    fn reproduces_both_reference_vectors() {
        for (secret, id, ts, body, expected) in VECTORS {
            let secret: Secret = secret.parse().unwrap();
            assert_eq!(secret.sign(id, ts, body.as_bytes()), expected);
            verify(&[secret], id, ts, body.as_bytes(), expected, ts, 300).unwrap();
        }
    }

    #[test]
    fn secrets_are_validated_and_redacted() {
        assert_eq!("MfKQ".parse::<Secret>(), Err(SecretError::MissingPrefix));
        assert_eq!("whsec_!!!".parse::<Secret>(), Err(SecretError::NotBase64));
        assert_eq!("whsec_AAAA".parse::<Secret>(), Err(SecretError::BadLength));
        let s = Secret::generate();
        assert_eq!(s.expose().parse::<Secret>().unwrap(), s);
        assert!(!format!("{s:?} {s}").contains(&s.expose()[6..]));
        assert_ne!(Secret::generate(), s);
    }

    #[test]
    fn stale_timestamps_and_unknown_secrets_fail() {
        let (secret, id, ts, body, sig) = VECTORS[0];
        let secret: Secret = secret.parse().unwrap();
        assert_eq!(
            verify(
                std::slice::from_ref(&secret),
                id,
                ts,
                body.as_bytes(),
                sig,
                ts + 301,
                300
            ),
            Err(VerifyError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify(&[Secret::generate()], id, ts, body.as_bytes(), sig, ts, 300),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            verify(
                &[secret],
                id,
                ts,
                body.as_bytes(),
                "v2,abc garbage",
                ts,
                300
            ),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    fn any_secret() -> impl Strategy<Value = Secret> {
        proptest::collection::vec(any::<u8>(), MIN_SECRET_BYTES..=MAX_SECRET_BYTES)
            .prop_map(|key| Secret { key })
    }

    proptest! {
        #[test]
        fn round_trip_with_rotation_and_tamper_detection(
            old in any_secret(),
            new in any_secret(),
            id in "[a-zA-Z0-9_]{1,40}",
            ts in 1_000_000_000i64..3_000_000_000,
            body in proptest::collection::vec(any::<u8>(), 0..512),
            flip in any::<usize>(),
        ) {
            let header = signature_header([&new, &old], &id, ts, &body);
            // Any one of the active secrets verifies on its own.
            prop_assert!(verify(std::slice::from_ref(&old), &id, ts, &body, &header, ts, 300).is_ok());
            prop_assert!(verify(std::slice::from_ref(&new), &id, ts, &body, &header, ts, 300).is_ok());
            // A changed byte of the id, the timestamp or the body fails.
            let mut bad_id = id.clone().into_bytes();
            let i = flip % bad_id.len();
            bad_id[i] = if bad_id[i] == b'x' { b'y' } else { b'x' };
            let bad_id = String::from_utf8(bad_id).unwrap();
            prop_assert!(verify(std::slice::from_ref(&new), &bad_id, ts, &body, &header, ts, 300).is_err());
            prop_assert!(verify(std::slice::from_ref(&new), &id, ts + 1, &body, &header, ts, 300).is_err());
            if !body.is_empty() {
                let mut bad_body = body.clone();
                let j = flip % bad_body.len();
                bad_body[j] ^= 0x01;
                prop_assert!(verify(std::slice::from_ref(&new), &id, ts, &bad_body, &header, ts, 300).is_err());
            }
        }
    }
}
