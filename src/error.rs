//! The one table of stable result codes shared by gRPC, HTTP and the Python client.
//!
//! Codes are the seed contract (`docs/python-api.md`, "Error codes"); they travel as plain integers
//! (`ret`) so a client can return them unchanged. Each layer keeps its own error enum and maps it to a
//! [`Code`] in one exhaustive `match`. The table itself is the `mooncake-conductor-codes` crate
//! (`codes/`), so that the Python client, which does not link the service, uses the same one.

pub use mooncake_conductor_codes::Code;

/// An operation failure: a stable code, the offending field when there is one, and a message for
/// humans. Transports render it (gRPC `ret` + message, HTTP 4xx/5xx body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct OpError {
    pub code: Code,
    /// The request field the error is about (HTTP reports it as `field`).
    pub field: Option<String>,
    /// Machine-readable reason (`missing`, `invalid_type`, `invalid_value`, `out_of_range`, ...).
    pub reason: &'static str,
    pub message: String,
    /// The position of the offending element within `field` (HTTP reports it as `index`).
    pub index: Option<u64>,
}

impl OpError {
    /// The same error about element `index` of its field.
    pub fn at(mut self, index: usize) -> Self {
        self.index = Some(index as u64);
        self
    }

    pub fn invalid(
        field: impl Into<String>,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        OpError {
            code: Code::InvalidParams,
            field: Some(field.into()),
            reason,
            message: message.into(),
            index: None,
        }
    }

    /// An invalid request that no single field is to blame for (for example a conflicting registration).
    pub fn invalid_registration(message: impl Into<String>) -> Self {
        OpError {
            code: Code::InvalidParams,
            field: None,
            reason: "invalid_registration",
            message: message.into(),
            index: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        OpError {
            code: Code::ServiceNotFound,
            field: None,
            reason: "not_found",
            message: message.into(),
            index: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        OpError {
            code: Code::InternalError,
            field: None,
            reason: "internal",
            message: message.into(),
            index: None,
        }
    }

    /// A missing or wrong token. The message never echoes what the caller sent.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        OpError {
            code: Code::Unauthorized,
            field: None,
            reason: "unauthorized",
            message: message.into(),
            index: None,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        OpError {
            code: Code::ConductorUnavailable,
            field: None,
            reason: "unavailable",
            message: message.into(),
            index: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_values_are_stable() {
        let table: Vec<(&str, i32)> = Code::ALL.iter().map(|c| (c.name(), c.value())).collect();
        assert_eq!(
            table,
            vec![
                ("OK", 0),
                ("INTERNAL_ERROR", -1),
                ("INVALID_PARAMS", -600),
                ("RPC_FAIL", -900),
                ("RPC_TIMEOUT", -901),
                ("CONDUCTOR_UNAVAILABLE", -2000),
                ("SERVICE_NOT_FOUND", -2001),
                ("UNAUTHORIZED", -2002),
            ]
        );
    }

    #[test]
    fn values_round_trip() {
        for code in Code::ALL {
            assert_eq!(Code::from_value(code.value()), Some(code));
        }
        assert_eq!(Code::from_value(1), None);
    }
}
