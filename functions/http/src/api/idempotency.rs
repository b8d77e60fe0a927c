//! Requests that change something, repeated under one `Idempotency-Key` (a client, or
//! a support desk's script, trying again after an answer it never got): the first
//! answer again, and the change made once. The resends use it, one delivery, one
//! failure or a batch, since each resend sends the webhook again.
//!
//! A key belongs to the caller's API key and to one route, and names one request: the
//! same key with another request is refused (422), never answered with the first
//! one's answer. While the first request runs, its key is claimed: a repeat then gets
//! 409 and is told to try again shortly.

use std::time::Duration;

use axum::http::HeaderMap;
use entrega_core::ports::CounterStore;
use entrega_core::remembered::IdempotencySlot;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::auth::Caller;
use super::problem::{ApiError, ApiResult};

/// How long the answer to a request with an `Idempotency-Key` is kept.
const ANSWER_KEPT_FOR: Duration = Duration::from_secs(24 * 3600);
/// How long a running request holds its key: if it dies, the key is free again soon.
const CLAIM_HELD_FOR: Duration = Duration::from_secs(300);
/// The longest key accepted.
const MAX_KEY_LEN: usize = 200;
/// Bytes of a request's mark (hex on the delivery): 128 bits tell requests apart and
/// keep a stored delivery small.
const MARK_BYTES: usize = 16;

/// Which request a key was used for, and its answer.
#[derive(Serialize, Deserialize)]
struct Remembered {
    request: String,
    answer: serde_json::Value,
}

/// One request, with its key if it came with one.
pub(super) struct IdempotentRequest {
    /// Where its claim and answer are kept; `None` without a key.
    slot: Option<IdempotencySlot>,
    /// The request's identity (see [`fingerprint`]).
    request: String,
}

/// A request's identity: the SHA-256 of what it asks, in canonical form.
pub(super) fn fingerprint(request: &impl Serialize) -> String {
    let canonical = serde_json::to_value(request)
        .map(|v| v.to_string())
        .unwrap_or_default();
    entrega_core::hex::lower_hex(&Sha256::digest(canonical.as_bytes()))
}

fn key_reused() -> ApiError {
    ApiError::invalid(
        "Idempotency-Key",
        "was already used for a different request; use a new key for a new request",
    )
}

impl IdempotentRequest {
    /// The request to `route` whose identity is `request` (see [`fingerprint`]), with
    /// the key its headers give, if any.
    pub fn new(
        headers: &HeaderMap,
        caller: &Caller,
        route: &str,
        request: String,
    ) -> ApiResult<Self> {
        let mut given = headers.get_all("idempotency-key").iter();
        let slot = match (given.next(), given.next()) {
            (None, _) => None,
            (Some(_), Some(_)) => {
                // Which one would it be? Each names a request of its own.
                return Err(ApiError::invalid("Idempotency-Key", "give it once"));
            }
            (Some(value), None) => {
                let key = std::str::from_utf8(value.as_bytes())
                    .ok()
                    .filter(|k| {
                        (1..=MAX_KEY_LEN).contains(&k.len())
                            && k.bytes().all(|b| b.is_ascii_graphic())
                    })
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "Idempotency-Key",
                            "1 to 200 visible ASCII characters (no spaces)",
                        )
                    })?;
                Some(IdempotencySlot {
                    route: route.to_owned(),
                    caller: caller.key_hash.clone(),
                    key: key.to_owned(),
                })
            }
        };
        Ok(Self { slot, request })
    }

    /// What a resend made by this request records on its delivery
    /// ([`entrega_core::delivery::Delivery::resent_for`]): the key's slot and the
    /// request, hashed. `None` without a key. A repeat after the first run died
    /// part-way (its answer never stored) finds what that run resent by it, and skips
    /// it: the key promises each resend once.
    pub fn mark(&self) -> Option<String> {
        let slot = self.slot.as_ref()?;
        let digest = Sha256::digest(format!("{slot}#{}", self.request).as_bytes());
        Some(entrega_core::hex::lower_hex(&digest[..MARK_BYTES]))
    }

    /// Before the work: the first answer if this request was made before (as JSON),
    /// or `None` with the key now claimed for this run.
    pub async fn first_answer(
        &self,
        store: &dyn CounterStore,
    ) -> ApiResult<Option<serde_json::Value>> {
        let Some(slot) = &self.slot else {
            return Ok(None);
        };
        if let Some(stored) = store.recall(&slot.answer()).await? {
            let stored: Remembered = serde_json::from_str(&stored).map_err(|e| {
                ApiError::backend(format!("a remembered answer is unreadable: {e}"))
            })?;
            if stored.request != self.request {
                return Err(key_reused());
            }
            return Ok(Some(stored.answer));
        }
        if let Some(running) = store
            .remember_once(&slot.claim(), &self.request, CLAIM_HELD_FOR)
            .await?
        {
            if running != self.request {
                return Err(key_reused());
            }
            return Err(ApiError::conflict(
                "a request with this Idempotency-Key is still running; repeat it shortly for its answer",
            ));
        }
        Ok(None)
    }

    /// The work failed. If it changed nothing (`changed_something` false: refused, or
    /// failed before doing anything), the key is free at once for the corrected
    /// request; otherwise it stays claimed until the claim expires, so a repeat cannot
    /// do the first part again.
    pub async fn failed(&self, store: &dyn CounterStore, changed_something: bool) -> ApiResult<()> {
        match &self.slot {
            Some(slot) if !changed_something => Ok(store.forget(&slot.claim()).await?),
            _ => Ok(()),
        }
    }

    /// The work succeeded with `answer`: keep it for the repeats.
    pub async fn answered(
        &self,
        store: &dyn CounterStore,
        answer: &impl Serialize,
    ) -> ApiResult<()> {
        let Some(slot) = &self.slot else {
            return Ok(());
        };
        let remembered = Remembered {
            request: self.request.clone(),
            answer: serde_json::to_value(answer).expect("an answer serialises"),
        };
        store
            .remember_once(
                &slot.answer(),
                &serde_json::to_string(&remembered).expect("an answer serialises"),
                ANSWER_KEPT_FOR,
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use entrega_core::tenant::Principal;

    fn request(keys: &[&[u8]]) -> ApiResult<IdempotentRequest> {
        let mut headers = HeaderMap::new();
        for key in keys {
            headers.append(
                "idempotency-key",
                axum::http::HeaderValue::from_bytes(key).unwrap(),
            );
        }
        let caller = Caller {
            principal: Principal::Admin,
            key_hash: "hash".into(),
        };
        IdempotentRequest::new(&headers, &caller, "route", "request".into())
    }

    /// A key is one run of visible ASCII, given once; anything else is refused with
    /// the header named, rather than taken as some other key (a tab, a space, or the
    /// first of two were).
    #[test]
    fn a_key_is_one_visible_word_given_once() {
        assert_eq!(request(&[]).unwrap().slot, None);
        assert_eq!(
            request(&[b"console-0f9e"])
                .unwrap()
                .slot
                .map(|slot| slot.claim()),
            Some("route#hash#console-0f9e#claim".into())
        );
        let long = [b'k'; MAX_KEY_LEN + 1];
        for refused in [
            &[&b"a\tb"[..]][..],
            &[b"a b"],
            &[b"caf\xc3\xa9"],
            &[&long[..]],
            &[b"a", b"b"],
        ] {
            let problem = request(refused).err().expect("refused");
            assert_eq!(problem.field.as_deref(), Some("Idempotency-Key"));
        }
    }
}
