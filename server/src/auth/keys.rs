//! Signing and checking Levee's tokens: HS256 JWTs with a pinned algorithm, issuer and
//! audience, and the UI's anti-CSRF token (an HMAC under the same secret), each accepted
//! under the current secret or a previous one still listed.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

use super::{
    AUDIENCE_AGENT, AUDIENCE_API, AUDIENCE_FLAGS, AuthError, Claims, Door, EXPIRY_LEEWAY, ISSUER, SESSION_TTL,
};
use crate::db::{Role, TokenKind, TokenRow, now_ms};

/// Signs and checks tokens: signs with the current secret, accepts a signature by the
/// current one or by any previous one still listed (a secret rotated by the operator:
/// tokens signed before the rotation keep working until they expire or the old secret is
/// taken off the list).
#[derive(Clone)]
pub struct Keys {
    enc: EncodingKey,
    dec: DecodingKey,
    previous: Vec<DecodingKey>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(<secret>)")
    }
}

fn now_s() -> u64 {
    (now_ms() / 1000) as u64
}

impl Keys {
    /// Keys from a shared secret (at least 32 bytes).
    pub fn new(secret: &[u8]) -> anyhow::Result<Keys> {
        Keys::rotated(secret, &[])
    }

    /// Keys signing with `current` and also accepting what `previous` secrets signed (each
    /// at least 32 bytes).
    pub fn rotated(current: &[u8], previous: &[&[u8]]) -> anyhow::Result<Keys> {
        anyhow::ensure!(current.len() >= 32, "the JWT secret must be at least 32 bytes");
        anyhow::ensure!(
            previous.iter().all(|p| p.len() >= 32),
            "every previous JWT secret must be at least 32 bytes"
        );
        Ok(Keys {
            enc: EncodingKey::from_secret(current)?,
            dec: DecodingKey::from_secret(current)?,
            previous: previous.iter().map(|p| DecodingKey::from_secret(p)).collect::<Result<_, _>>()?,
        })
    }

    /// The current key, then the previous ones.
    fn decoding_keys(&self) -> impl Iterator<Item = &DecodingKey> {
        std::iter::once(&self.dec).chain(&self.previous)
    }

    /// Signs claims with HS256.
    pub fn sign(&self, claims: &Claims) -> anyhow::Result<String> {
        Ok(jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.enc)?)
    }

    /// Verifies signature (HS256 only), issuer, audience and expiry.
    pub fn verify(&self, token: &str, audience: &str) -> Result<Claims, AuthError> {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_audience(&[audience]);
        v.set_issuer(&[ISSUER]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = EXPIRY_LEEWAY;
        let mut last = None;
        for key in self.decoding_keys() {
            match jsonwebtoken::decode::<Claims>(token, key, &v) {
                Ok(data) => return Ok(data.claims),
                // Another key may have signed it: only a bad signature moves on.
                Err(e) if matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) => {
                    last = Some(e)
                }
                Err(e) => return Err(token_error(&e)),
            }
        }
        Err(token_error(&last.expect("there is always a current key")))
    }

    /// A login session token for a user, for `door`, at the user's session `epoch`.
    pub fn session(
        &self,
        username: &str,
        role: Role,
        epoch: i64,
        door: Door,
    ) -> anyhow::Result<(String, u64)> {
        let iat = now_s();
        let exp = iat + SESSION_TTL.as_secs();
        let claims = Claims {
            sub: username.to_string(),
            iss: ISSUER.into(),
            aud: door.audience().into(),
            exp,
            iat,
            jti: uuid::Uuid::new_v4().to_string(),
            kind: "session".into(),
            role: Some(role),
            env: None,
            services: Vec::new(),
            epoch: Some(epoch),
        };
        Ok((self.sign(&claims)?, exp))
    }

    /// The anti-CSRF token of a UI session: HMAC-SHA256, under the JWT key, of the
    /// session's token id with a fixed label (so it can never be mistaken for a JWT
    /// signature). Bound to one session; nothing is stored.
    pub fn csrf_token(&self, session_id: &str) -> anyhow::Result<String> {
        Ok(jsonwebtoken::crypto::sign(&csrf_message(session_id), &self.enc, Algorithm::HS256)?)
    }

    /// Whether `token` is the anti-CSRF token of the session `session_id` (constant-time).
    pub fn check_csrf_token(&self, session_id: &str, token: &str) -> bool {
        !token.is_empty()
            && self.decoding_keys().any(|key| {
                jsonwebtoken::crypto::verify(token, &csrf_message(session_id), key, Algorithm::HS256)
                    .unwrap_or(false)
            })
    }

    /// Mints the JWT of a token row.
    pub fn mint(&self, t: &TokenRow) -> anyhow::Result<String> {
        let claims = Claims {
            sub: t.name.clone(),
            iss: ISSUER.into(),
            aud: match t.kind {
                TokenKind::Api => AUDIENCE_API.into(),
                TokenKind::Agent => AUDIENCE_AGENT.into(),
                TokenKind::Flags => AUDIENCE_FLAGS.into(),
            },
            exp: (t.expires_at / 1000) as u64,
            iat: (t.created_at / 1000) as u64,
            jti: t.id.clone(),
            kind: t.kind.as_str().into(),
            role: t.role,
            env: t.environment.clone(),
            services: t.services.clone(),
            epoch: None,
        };
        self.sign(&claims)
    }
}

fn token_error(e: &jsonwebtoken::errors::Error) -> AuthError {
    match e.kind() {
        jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
        other => AuthError::Invalid(format!("{other:?}").to_lowercase()),
    }
}

fn csrf_message(session_id: &str) -> Vec<u8> {
    format!("levee-ui-csrf\0{session_id}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(&[7u8; 32]).unwrap()
    }

    #[test]
    fn session_verifies_only_for_its_audience() {
        let k = keys();
        let (tok, _) = k.session("alice", Role::Operator, 0, Door::Api).unwrap();
        assert_eq!(k.verify(&tok, AUDIENCE_API).unwrap().sub, "alice");
        assert!(matches!(k.verify(&tok, AUDIENCE_AGENT), Err(AuthError::Invalid(_))));
    }

    #[test]
    fn other_key_and_alg_none_are_refused() {
        let (tok, _) = keys().session("alice", Role::Admin, 0, Door::Api).unwrap();
        let other = Keys::new(&[8u8; 32]).unwrap();
        assert!(matches!(other.verify(&tok, AUDIENCE_API), Err(AuthError::Invalid(_))));
        // alg=none: header {"alg":"none","typ":"JWT"}, same payload, empty signature.
        let payload = tok.split('.').nth(1).unwrap();
        let none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.");
        assert!(keys().verify(&none, AUDIENCE_API).is_err());
    }

    /// A rotated secret: what the old one signed is accepted until it expires, new tokens
    /// are signed with the new one (which a replica still on the old key alone refuses),
    /// and once the old secret is taken off the list its tokens are refused.
    #[test]
    fn rotated_secret_accepts_old_tokens_and_signs_with_the_new_one() {
        let (old_tok, _) = keys().session("alice", Role::Admin, 0, Door::Api).unwrap();
        let old_csrf = keys().csrf_token("s").unwrap();
        let rotated = Keys::rotated(&[9u8; 32], &[&[7u8; 32]]).unwrap();
        assert_eq!(rotated.verify(&old_tok, AUDIENCE_API).unwrap().sub, "alice");
        assert!(rotated.check_csrf_token("s", &old_csrf));
        let (new_tok, _) = rotated.session("bob", Role::Admin, 0, Door::Api).unwrap();
        assert!(matches!(keys().verify(&new_tok, AUDIENCE_API), Err(AuthError::Invalid(_))));
        let done = Keys::new(&[9u8; 32]).unwrap();
        assert!(matches!(done.verify(&old_tok, AUDIENCE_API), Err(AuthError::Invalid(_))));
        assert_eq!(done.verify(&new_tok, AUDIENCE_API).unwrap().sub, "bob");
        // The audience is still checked with an old key.
        assert!(matches!(rotated.verify(&old_tok, AUDIENCE_AGENT), Err(AuthError::Invalid(_))));
        assert!(Keys::rotated(&[9u8; 32], &[b"short"]).is_err());
    }

    #[test]
    fn csrf_token_is_bound_to_the_session_and_the_key() {
        let k = keys();
        let t = k.csrf_token("session-a").unwrap();
        assert!(k.check_csrf_token("session-a", &t));
        assert!(!k.check_csrf_token("session-b", &t));
        assert!(!k.check_csrf_token("session-a", ""));
        assert!(!k.check_csrf_token("session-a", "not base64 at all!"));
        let other = Keys::new(&[8u8; 32]).unwrap();
        assert!(!other.check_csrf_token("session-a", &t));
    }

    #[test]
    fn expired_token_is_expired() {
        let k = keys();
        let claims = Claims {
            sub: "a".into(),
            iss: ISSUER.into(),
            aud: AUDIENCE_API.into(),
            exp: 1000,
            iat: 10,
            jti: "j".into(),
            kind: "session".into(),
            role: Some(Role::Viewer),
            env: None,
            services: vec![],
            epoch: None,
        };
        let tok = k.sign(&claims).unwrap();
        assert_eq!(k.verify(&tok, AUDIENCE_API).unwrap_err(), AuthError::Expired);
    }
}
