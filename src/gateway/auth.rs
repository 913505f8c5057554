//! The optional shared token: which requests need it, and the check itself.
//!
//! Both transports carry it the same way, `authorization: Bearer <token>` (an HTTP header, gRPC
//! metadata). With no token configured everything is open, as before. With one, registration
//! changes need it; reads need it too when `auth_reads` is set. Health never needs it: a load
//! balancer probes it without credentials, and it reveals nothing but readiness.
//!
//! Several tokens may be configured at once, so that an operator can rotate without a window in
//! which some clients are refused (add the new one, move the clients, remove the old one).

use std::fmt;

use crate::error::OpError;

/// What a request does, for deciding whether it needs the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `/health`, gRPC `Health`: always open.
    Health,
    /// Queries, listings, status, metrics.
    Read,
    /// `register`, `unregister`, and the answers to a suspected etcd reset
    /// (`/registry/reupload`, `/registry/accept`).
    Write,
}

/// The accepted tokens. `Debug` never shows them, so a logged configuration cannot leak one.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tokens(Vec<Vec<u8>>);

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tokens({} redacted)", self.0.len())
    }
}

/// Longest token accepted in the configuration: far above any generated secret, and small enough
/// that comparing against every configured token costs nothing.
pub const MAX_TOKEN_BYTES: usize = 1024;

impl Tokens {
    /// Parse a comma-separated list (the config value and the environment variable alike).
    /// Each token is visible ASCII without commas, so it fits an HTTP header and gRPC metadata
    /// unchanged; the error never repeats the text, which is a secret.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut tokens = Vec::new();
        for (i, token) in text.split(',').map(str::trim).enumerate() {
            if token.is_empty() {
                return Err(format!("token {} of the list is empty", i + 1));
            }
            if token.len() > MAX_TOKEN_BYTES {
                return Err(format!(
                    "token {} is longer than {MAX_TOKEN_BYTES} bytes",
                    i + 1
                ));
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "token {} must be visible ASCII characters without spaces",
                    i + 1
                ));
            }
            tokens.push(token.as_bytes().to_vec());
        }
        Ok(Tokens(tokens))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The token this service presents to a peer (replicas of one fleet share their tokens).
    pub fn first(&self) -> Option<&[u8]> {
        self.0.first().map(Vec::as_slice)
    }

    /// Whether `presented` is one of the tokens. Every token is compared in full whatever the
    /// outcome, so the time taken tells nothing about which bytes matched.
    fn accepts(&self, presented: &[u8]) -> bool {
        let mut any = false;
        for token in &self.0 {
            any |= constant_time_eq(token, presented);
        }
        any
    }
}

/// Equality of two byte strings in time that depends on their lengths only, never on where they
/// first differ (a timing side channel would let a peer guess a token byte by byte).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
        // Keeps the optimiser from turning the loop into an early-exit comparison.
        diff = std::hint::black_box(diff);
    }
    diff == 0
}

/// The gateway's policy: the tokens (none: open) and whether reads need one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    tokens: Tokens,
    reads: bool,
}

impl Auth {
    pub fn new(tokens: Tokens, reads: bool) -> Self {
        Auth { tokens, reads }
    }

    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Check one request: `authorization` is the raw header or metadata value, if any.
    pub fn check(&self, access: Access, authorization: Option<&[u8]>) -> Result<(), OpError> {
        let needed = match access {
            Access::Health => false,
            Access::Read => self.reads,
            Access::Write => true,
        };
        if !needed || self.tokens.is_empty() {
            return Ok(());
        }
        let Some(value) = authorization else {
            return Err(OpError::unauthorized(
                "this request needs the service token: send `Authorization: Bearer <token>`",
            ));
        };
        match bearer(value) {
            Some(token) if self.tokens.accepts(token) => Ok(()),
            // The same answer for a wrong scheme and a wrong token, and never the value sent.
            _ => Err(OpError::unauthorized(
                "the Authorization header does not carry a valid `Bearer <token>`",
            )),
        }
    }
}

/// The credentials of `Bearer <token>` (the scheme is case-insensitive, RFC 7235).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let token = value[SCHEME.len()..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn auth(list: &str, reads: bool) -> Auth {
        Auth::new(Tokens::parse(list).unwrap(), reads)
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"", b"x"));
        // Lengths that differ by a multiple of 256 must not cancel out.
        assert!(!constant_time_eq(&[0; 256], b""));
    }

    #[test]
    fn without_tokens_everything_is_open() {
        let open = Auth::default();
        assert!(!open.enabled());
        for access in [Access::Health, Access::Read, Access::Write] {
            assert_eq!(open.check(access, None), Ok(()));
        }
    }

    #[test]
    fn writes_need_a_listed_bearer_token() {
        let a = auth("old,new", false);
        assert!(a.enabled());
        let refused = a.check(Access::Write, None).unwrap_err();
        assert_eq!(
            (refused.code, refused.reason),
            (Code::Unauthorized, "unauthorized")
        );
        assert_eq!(a.check(Access::Write, Some(b"Bearer old")), Ok(()));
        assert_eq!(a.check(Access::Write, Some(b"bearer new")), Ok(()));
        assert_eq!(a.check(Access::Write, Some(b"BEARER  new ")), Ok(()));
        for bad in [
            &b"Bearer ol"[..],
            b"Bearer olds",
            b"Bearer old,new",
            b"Bearer ",
            b"Bearer",
            b"old",
            b"Basic b2xk",
            b"",
        ] {
            let e = a.check(Access::Write, Some(bad)).unwrap_err();
            assert_eq!(
                e.code,
                Code::Unauthorized,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            assert!(
                !e.message.contains("old"),
                "never echoes a token: {}",
                e.message
            );
        }
        assert_eq!(a.check(Access::Read, None), Ok(()), "reads stay open");
        assert_eq!(a.check(Access::Health, None), Ok(()));
    }

    #[test]
    fn auth_reads_closes_reads_but_not_health() {
        let a = auth("t", true);
        assert_eq!(
            a.check(Access::Read, None).map_err(|e| e.code),
            Err(Code::Unauthorized)
        );
        assert_eq!(a.check(Access::Read, Some(b"Bearer t")), Ok(()));
        assert_eq!(a.check(Access::Health, None), Ok(()));
    }

    #[test]
    fn token_lists_are_checked_without_repeating_them() {
        assert_eq!(Tokens::parse("a, b ,c").unwrap().len(), 3);
        for bad in ["", "a,,b", "a,", "with space", "tab\tbed", "é"] {
            let e = Tokens::parse(bad).unwrap_err();
            assert!(bad.is_empty() || !e.contains(bad), "{e}");
        }
        assert!(Tokens::parse(&"x".repeat(MAX_TOKEN_BYTES + 1)).is_err());
        let debug = format!("{:?}", Tokens::parse("hidden").unwrap());
        assert!(!debug.contains("hidden"), "{debug}");
    }
}
