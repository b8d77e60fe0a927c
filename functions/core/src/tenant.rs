//! Tenants and the API keys that act for them.

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::TenantId;

/// Every API key starts with this, so a leaked one is recognisable.
pub const API_KEY_PREFIX: &str = "ent_";
/// Random bytes in a generated key (256 bits: hashing with a plain SHA-256 is then
/// safe, no slow KDF needed, because the key cannot be guessed).
const API_KEY_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    pub owner_email: String,
    pub created_at: DateTime<Utc>,
}

/// Who an API key acts for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "tenant_id", rename_all = "snake_case")]
pub enum Principal {
    /// Support staff: every tenant, and creating tenants.
    Admin,
    Tenant(TenantId),
}

/// A new random API key, in the form shown once to its owner.
pub fn generate_api_key() -> String {
    let mut bytes = [0u8; API_KEY_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("{API_KEY_PREFIX}{}", crate::hex::lower_hex(&bytes))
}

/// What the store keeps instead of the key: its SHA-256, hex.
pub fn hash_api_key(key: &str) -> String {
    crate::hex::lower_hex(&Sha256::digest(key.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hashes_stable() {
        let (a, b) = (generate_api_key(), generate_api_key());
        assert_ne!(a, b);
        assert!(a.starts_with(API_KEY_PREFIX));
        assert_eq!(hash_api_key(&a), hash_api_key(&a));
        assert_ne!(hash_api_key(&a), hash_api_key(&b));
        assert!(!hash_api_key(&a).contains(&a[4..]));
    }
}
